#pragma once
// Options of ddp::DistributedDataParallel, LibTorch style: named setters that chain,
//   DistributedDataParallelOptions().bucket_cap_mb(50).find_unused_parameters(true)

#include <torch/arg.h>

#include <chrono>
#include <string>

#include "ddp/torch/ddp/comm_hooks.hpp"
#include "ddp/torch/ddp/stop_request.hpp"

namespace ddp {

struct DistributedDataParallelOptions {
  static constexpr double kDefaultBucketCapMb = 25.0;
  static constexpr double kDefaultFirstBucketCapMb = 1.0;

  // Size at which a gradient bucket is closed and its all-reduce launched (MiB). Larger:
  // fewer, bigger messages; smaller: communication starts earlier in backward.
  TORCH_ARG(double, bucket_cap_mb) = kDefaultBucketCapMb;
  // Cap of the first bucket (the last layers' gradients, ready first), kept small so
  // communication starts early, like PyTorch's 1 MiB.
  TORCH_ARG(double, first_bucket_cap_mb) = kDefaultFirstBucketCapMb;
  // Broadcast the module's buffers (e.g. BatchNorm running stats) from rank 0 before every
  // forward through the wrapper.
  TORCH_ARG(bool, broadcast_buffers) = true;
  // Construction checks that every rank has the same parameters and broadcasts rank 0's
  // parameters and buffers (PyTorch's init_sync). false skips both: the step manager
  // (recovery/step_manager.hpp) brings every rank to the state of a healthy peer instead, which
  // a rank restarted in place needs (rank 0 may be the restarted one).
  TORCH_ARG(bool, init_sync) = true;
  // Allow parameters that get no gradient in some iterations (costs a graph traversal per
  // forward and one small all-reduce per backward).
  TORCH_ARG(bool, find_unused_parameters) = false;
  // The autograd graph is the same in every iteration (PyTorch's static_graph): the first
  // synchronized backward counts how often each parameter's gradient hook fires and reduces
  // everything when it ends; later ones launch a parameter's bucket after its last expected
  // firing. This allows a parameter used several times in one forward (shared modules) and
  // reentrant backward (activation checkpointing), and fixes the unused parameters to those of
  // the first iteration without any graph search (find_unused_parameters then costs nothing
  // after it). A graph that changes anyway is a UsageError naming the parameter.
  TORCH_ARG(bool, static_graph) = false;
  // Make param.grad() a view into the bucket buffer: saves a copy each way and the memory of
  // one gradient copy. Code that replaces param.grad() by another tensor defeats it.
  TORCH_ARG(bool, gradient_as_bucket_view) = false;
  // How a bucket is averaged; null means allreduce_hook(). See comm_hooks.hpp.
  TORCH_ARG(CommHookPtr, comm_hook) = nullptr;
  // Where to write this rank's Chrome trace of forward, backward, bucket all-reduces and
  // optimizer steps; "{rank}" is replaced by the rank (required when world size > 1). Empty:
  // no timeline. Written when the wrapper is destroyed, or by write_timeline().
  TORCH_ARG(std::string, timeline_path) = "";
  // A stop request the gradient all-reduce carries, so every rank agrees on it at the same step
  // with no collective of its own (stop_request.hpp). Null: nothing carried.
  TORCH_ARG(StopRequestPtr, stop_request) = nullptr;
  // Bound on every wait for communication; zero means the process group's timeout.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::milliseconds(0);
};

}  // namespace ddp
