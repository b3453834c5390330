#pragma once
// Checking and adapting the tensors torch.distributed hands the ddp backend to ddp's
// (pointer, count, DataType) collectives.
//
// - Tensors must be dense CPU tensors: CUDA tensors are refused with the fix (use nccl).
// - Reductions need a dtype ddp reduces (float32/64, float16, bfloat16, int32/64, uint8; bool
//   for min/max). Operations that only move bytes (broadcast, gathers, scatter, all_to_all,
//   send/recv) take any dtype: one ddp does not know travels as bytes.
// - Contiguous tensors are passed by their data pointer (zero copy); others go through a
//   contiguous copy that is copied back when the operation finished.

#include <torch/extension.h>

#include <optional>
#include <string>

#include "ddp/comm/types.hpp"

namespace ddp::python {

// The ddp DataType of a torch dtype, or nullopt.
std::optional<DataType> to_data_type(at::ScalarType type);

// torch's name of a dtype without the "torch." ("float32", "int16", "complex64").
std::string dtype_name(at::ScalarType type);

// Throws UsageError unless `t` is a dense CPU tensor. `op` names the operation.
void check_cpu_dense(const at::Tensor& t, const std::string& op);

// Throws UsageError unless `tensors` holds exactly one tensor (the ddp backend drives one
// device per process), then checks it with check_cpu_dense.
const at::Tensor& single_tensor(const std::vector<at::Tensor>& tensors, const std::string& op);

// Throws UsageError unless every tensor of `ts` has `dtype` (and, when `numel` is set, that
// many elements). `what` names the list in messages.
void check_same(const std::vector<at::Tensor>& ts, at::ScalarType dtype,
                std::optional<int64_t> numel, const std::string& op, const std::string& what);

// A buffer for a byte-moving operation: the native DataType when ddp has one, else bytes.
struct Elements {
  DataType dtype;
  size_t count;
};
Elements move_elements(at::ScalarType type, int64_t numel);

// The DataType a reduction `op` (ddp's) runs on for `type`; throws NotSupportedError naming
// the dtype, the operation and the supported dtypes.
DataType reduce_data_type(at::ScalarType type, const std::string& op);

// `t` itself when contiguous, else a contiguous copy (to be copied back with copy_back).
inline at::Tensor contiguous(const at::Tensor& t) {
  return t.is_contiguous() ? t : t.contiguous();
}

// Copies `staged` into `dst` unless they are the same tensor.
inline void copy_back(const at::Tensor& dst, const at::Tensor& staged) {
  if (!staged.is_same(dst)) dst.copy_(staged.view(dst.sizes()));
}

}  // namespace ddp::python
