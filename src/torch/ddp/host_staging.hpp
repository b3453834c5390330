#pragma once
// Host staging that overlaps with the backward: how a CUDA bucket reaches a host backend
// (cpu, gloo, MPI) without stopping the autograd thread.
//
// The synchronous way (`pinned_host_copy`, then the all-reduce) blocks the autograd thread
// until the GPU has computed the bucket and copied it out: the GPU then idles while the
// thread queues the rest of the backward. Here the copy is queued on a side stream (after the
// kernels that filled the bucket), an event marks its end, and a process-wide staging thread
// issues the all-reduce once that event completed, in launch order; the autograd thread goes on
// queueing kernels at once. finish() waits for the all-reduce and queues the copy back on the
// current stream (from pinned memory: asynchronous, the caching host allocator keeps the
// host buffer until that copy ran).
//
// Only in builds against a CUDA LibTorch; DDP_HOST_STAGING=sync selects the synchronous way
// (what ddp did before, kept for comparison and as a way out).

#include <torch/types.h>

#include <memory>
#include <string>

#include "ddp/comm/process_group.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/torch/ddp/comm_hooks.hpp"

namespace ddp {

// Whether launch_staged_all_reduce stages (a CUDA build, DDP_HOST_STAGING not "sync").
bool overlapped_host_staging();

// Reduces `device_wire` (a CUDA tensor holding what goes on the wire: the bucket itself, or a
// converted copy) with `op` over the host backend `pg` through pinned host memory, and copies
// the result into `bucket` at finish(). `tag` names the collective in the flight recorder (the
// staging thread carries no tag of the caller's). Call only when overlapped_host_staging().
std::unique_ptr<BucketReduction> launch_staged_all_reduce(ProcessGroup& pg,
                                                          const torch::Tensor& bucket,
                                                          const torch::Tensor& device_wire,
                                                          ReduceOp op, std::string tag);

// Order keeping for a bucket that needs no staging (a CPU bucket beside CUDA ones, or a host
// tensor the hook made): while staged launches are still queued, its all-reduce of `wire` (a
// host tensor; its result goes into `bucket` at finish()) is queued behind them, so every rank
// issues the collectives in launch order. Null when nothing is queued: launch it directly.
std::unique_ptr<BucketReduction> launch_behind_staged(ProcessGroup& pg, const torch::Tensor& bucket,
                                                      const torch::Tensor& wire, ReduceOp op,
                                                      std::string tag);

}  // namespace ddp
