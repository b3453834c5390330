#pragma once
// stream_order: how the torch layer keeps the nccl backend's collectives in order with the
// kernels LibTorch queues on its current CUDA stream, and where a group's buffers must live.
//
// The nccl backend orders each collective after the work queued on the group's compute stream
// and makes that stream wait in Work::wait (nccl_process_group.hpp). LibTorch queues kernels
// on its *current* stream, which differs per thread (autograd's device threads, stream guards
// of the caller), so the torch layer points the group's compute stream at LibTorch's current
// stream right before every collective it issues and before every wait:
//
//   use_current_stream(pg);  auto work = pg.all_reduce(...);   // runs after queued kernels
//   use_current_stream(pg);  work->wait(timeout);               // later kernels see the result
//
// Both calls are no-ops for host backends and in builds against a CPU-only LibTorch
// (DDP_WITH_CUDA_TORCH undefined), so callers need no #if.

#include <torch/torch.h>

#include <chrono>
#include <string>

#include "ddp/comm/process_group.hpp"
#include "ddp/comm/work.hpp"

namespace ddp {

// Whether this build's LibTorch has CUDA (the torch layer was compiled with
// DDP_WITH_CUDA_TORCH). torch::cuda::is_available() also needs a visible GPU.
bool built_with_cuda_torch();

// The device a buffer handed to `pg` must live on: cuda:<group device> for the nccl backend,
// the CPU for every other backend. With the nccl backend in a build against a CPU-only
// LibTorch this is a UsageError (such a LibTorch cannot make CUDA tensors).
torch::Device comm_device(const ProcessGroup& pg);

// With the nccl backend: makes LibTorch's current CUDA stream on the group's device the
// group's compute stream. No-op otherwise.
void use_current_stream(ProcessGroup& pg);

// With the nccl backend: tells LibTorch's caching allocator that `tensor`'s memory is used on
// the group's communication stream, so freeing it before the collective ran cannot hand the
// block to new work (torch's ProcessGroupNCCL does the same). The tensor_adapter wrappers call
// it for every tensor they issue. No-op otherwise and for memory not from that allocator.
void record_on_comm_stream(ProcessGroup& pg, const torch::Tensor& tensor);

// use_current_stream(pg), then work.wait(timeout).
void wait_on_current_stream(ProcessGroup& pg, Work& work, std::chrono::milliseconds timeout);

// Throws UsageError when `tensor` cannot be handed to `pg` without a copy the caller did not
// plan: a CPU tensor or one on another GPU with the nccl backend. `what` names it
// ("parameter 'fc1.weight'"). CUDA tensors on host backends are fine (staged through host
// memory, see needs_host_staging).
void check_tensor_device(const ProcessGroup& pg, const torch::Tensor& tensor,
                         const std::string& what);

}  // namespace ddp
