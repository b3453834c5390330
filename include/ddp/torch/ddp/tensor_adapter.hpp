#pragma once
// tensor_adapter: the bridge between LibTorch tensors and the (pointer, count, DataType)
// collectives of ddp::ProcessGroup.
//
// Contract: a tensor handed to a collective must be dense (strided layout), contiguous and of
// a dtype the comm layer knows (float32/64, float16, bfloat16, int32/64, uint8). Anything else
// is a UsageError naming the tensor's dtype/layout and the fix (.contiguous(), .to(...)),
// never a silent copy: a silent copy would make an in-place collective write into a temporary.
// Pointers of CUDA tensors are device pointers; only a backend that says it accepts them
// (nccl) may be given one, see needs_host_staging().

#include <torch/torch.h>

#include <optional>
#include <string>

#include "ddp/comm/process_group.hpp"
#include "ddp/comm/types.hpp"

namespace ddp {

// A tensor's storage as the comm layer sees it.
struct TensorBuffer {
  void* data = nullptr;
  size_t count = 0;  // elements
  DataType dtype = DataType::kFloat32;
};

// The DataType of a scalar type, or nullopt when the comm layer has none for it.
std::optional<DataType> to_data_type(c10::ScalarType type);

// The scalar type of a DataType (always exists).
c10::ScalarType to_scalar_type(DataType dtype);

// The buffer of a dense contiguous tensor. `what` names the tensor in error messages, e.g.
// "parameter 'fc1.weight'". Throws UsageError for non-contiguous, sparse or unsupported dtypes.
TensorBuffer tensor_buffer(const torch::Tensor& tensor, const std::string& what = "tensor");

// Whether `tensor` lives on a device whose memory `pg` cannot address directly, so a
// collective on it must go through a host copy. True for CUDA tensors on any backend but nccl.
bool needs_host_staging(const torch::Tensor& tensor, const ProcessGroup& pg);

// A contiguous copy of the CUDA `tensor` in pinned (page-locked) host memory, for a
// collective on a host backend; written back with `tensor.copy_(copy)`. The copy waits for
// the work queued on the current CUDA stream (it is synchronous). Pinned memory moves at the
// link's full speed in both directions, a pageable copy at a fraction of it (the driver
// stages it through a pinned buffer of its own); the caching host allocator reuses the
// blocks, so steady-state training allocates none.
torch::Tensor pinned_host_copy(const torch::Tensor& tensor);

// Convenience wrappers: in-place collectives on one tensor (asynchronous, like the
// ProcessGroup calls; keep the tensor alive until wait() returns). With the nccl backend they
// order the collective after LibTorch's current CUDA stream (stream_order.hpp); wait with
// wait_on_current_stream so that stream also waits for the result.
WorkPtr all_reduce(ProcessGroup& pg, const torch::Tensor& tensor, ReduceOp op = ReduceOp::kSum);
WorkPtr broadcast(ProcessGroup& pg, const torch::Tensor& tensor, int root);

}  // namespace ddp
