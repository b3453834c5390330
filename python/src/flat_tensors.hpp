#pragma once
// Tensors laid out flat in host memory, for operations that move several tensors as one
// buffer (coalesced all_reduce, reduce_scatter, scatter, all_to_all).

#include <torch/extension.h>

#include <vector>

#include "op_route.hpp"

namespace ddp::python {

// Packs `ts` (equal dtype) into one contiguous 1-D tensor in host memory.
inline at::Tensor pack(const std::vector<at::Tensor>& ts) {
  return OpRoute{}.pack(ts);  // the host route
}

// The bytes of a contiguous tensor as a 1-D uint8 tensor sharing its storage.
inline at::Tensor bytes_of(const at::Tensor& contiguous_tensor) {
  return at::from_blob(contiguous_tensor.data_ptr(),
                       {static_cast<int64_t>(contiguous_tensor.nbytes())},
                       at::TensorOptions().dtype(at::kByte));
}

}  // namespace ddp::python
