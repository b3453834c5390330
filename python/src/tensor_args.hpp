#pragma once
// Checking and adapting the tensors torch.distributed hands the ddp backend to ddp's
// (pointer, count, DataType) collectives.
//
// - Tensors must be dense CPU or CUDA tensors. CUDA tensors run on the group's NCCL lane where it
//   has one (nccl_lane.hpp, op_route.hpp); otherwise ddp's collectives run in host memory, and
//   CUDA tensors are staged through the host (as gloo does): copied to a host buffer when the
//   operation is called (after the work queued on the caller's current CUDA stream, which the
//   copy waits for) and copied back into the CUDA tensor when it finished (a synchronous copy:
//   the result is on the device before the Work completes). docs/python.md.
// - Reductions need a dtype ddp reduces (float32/64, float16, bfloat16, int32/64, uint8; bool
//   for min/max). Operations that only move bytes (broadcast, gathers, scatter, all_to_all,
//   send/recv) take any dtype: one ddp does not know travels as bytes.
// - Contiguous CPU tensors are passed by their data pointer (zero copy); others go through a
//   contiguous host copy that is copied back when the operation finished.

#include <torch/extension.h>

#include <optional>
#include <string>

#include "ddp/comm/types.hpp"

namespace ddp::python {

// The ddp DataType of a torch dtype, or nullopt.
std::optional<DataType> to_data_type(at::ScalarType type);

// torch's name of a dtype without the "torch." ("float32", "int16", "complex64").
std::string dtype_name(at::ScalarType type);

// Throws UsageError unless `t` is a dense tensor in CPU or CUDA memory. `op` names the
// operation.
void check_dense(const at::Tensor& t, const std::string& op);

// Throws UsageError unless `tensors` holds exactly one tensor (the ddp backend drives one
// device per process), then checks it with check_dense.
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

// The options of `t` in host memory: buffers that ddp reads or writes directly.
inline at::TensorOptions host_options(const at::Tensor& t) {
  return t.options().device(at::kCPU);
}

// `t` itself when a contiguous CPU tensor, else a contiguous host copy (to be copied back with
// copy_back). Copying a CUDA tensor to the host waits for the caller's current stream.
inline at::Tensor host_contiguous(const at::Tensor& t) {
  if (t.is_cpu()) return t.is_contiguous() ? t : t.contiguous();
  return t.to(at::TensorOptions().device(at::kCPU), /*non_blocking=*/false, /*copy=*/false,
              at::MemoryFormat::Contiguous);
}

// Copies `staged` into `dst` unless they are the same tensor (across devices too: a CUDA `dst`
// holds the result when this returns).
inline void copy_back(const at::Tensor& dst, const at::Tensor& staged) {
  if (!staged.is_same(dst)) dst.copy_(staged.view(dst.sizes()));
}

}  // namespace ddp::python
