#pragma once
// OpRoute: where one operation of a `ddp`-backend group runs, chosen when it is called
// (ProcessGroupDDP::route): on the group's NCCL lane (nccl_lane.hpp: its tensors are CUDA
// tensors, its buffers stay in device memory and it is ordered on the caller's current stream)
// or on the host group (CPU tensors, and CUDA tensors staged through host memory:
// tensor_args.hpp).

#include <c10/core/Stream.h>
#include <torch/extension.h>

#include <optional>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "tensor_args.hpp"

namespace ddp::python {

struct OpRoute {
  ProcessGroupPtr nccl;               // set: the lane's NCCL group
  std::optional<c10::Stream> stream;  // with nccl: the caller's current stream on its device

  bool on_device() const { return nccl != nullptr; }

  // The buffer ddp reads and writes for `t`: `t` itself when it is contiguous and where the
  // operation runs, else a contiguous copy there (copied back with copy_back).
  at::Tensor buffer(const at::Tensor& t) const {
    return on_device() ? t.contiguous() : host_contiguous(t);
  }
  // The options of a scratch buffer of `t`'s dtype where the operation runs.
  at::TensorOptions options(const at::Tensor& t) const {
    return on_device() ? t.options() : host_options(t);
  }
  // `ts` (equal dtype) packed into one contiguous 1-D buffer where the operation runs.
  at::Tensor pack(const std::vector<at::Tensor>& ts) const {
    std::vector<at::Tensor> flat;
    flat.reserve(ts.size());
    for (const auto& t : ts) flat.push_back(t.reshape(-1));
    return buffer(at::cat(flat));
  }
};

}  // namespace ddp::python
