#pragma once
// Communication hooks: how DDP turns one bucket of local gradients into their average over
// the ranks (torch.distributed.algorithms.ddp_comm_hooks). The default all-reduces in the
// bucket's dtype; the compression hooks halve the bytes on the wire at the cost of precision.
//
// Contract of a hook: launch() starts the reduction of `bucket` (a contiguous 1-D tensor
// holding this rank's gradients) and returns at once; the bucket must stay alive and untouched
// until finish() returns, after which it holds the average over all ranks of the group.
// `pg` outlives the reduction. Every rank must use the same hook. With the nccl backend, issue
// through the tensor_adapter wrappers and wait with wait_on_current_stream (stream_order.hpp),
// so the collective runs after the kernels that filled the bucket and finish()'s caller sees
// the result on LibTorch's current stream.

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <string>

#include "ddp/comm/process_group.hpp"

namespace ddp {

// One bucket's reduction in flight.
class BucketReduction {
 public:
  virtual ~BucketReduction() = default;
  // Whether the communication has finished; never blocks.
  virtual bool is_completed() = 0;
  // Waits (bounded by timeout) and leaves the average in the bucket.
  virtual void finish(std::chrono::milliseconds timeout) = 0;
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  virtual std::unique_ptr<BucketReduction> launch(ProcessGroup& pg,
                                                  const torch::Tensor& bucket) = 0;
};

using CommHookPtr = std::shared_ptr<CommHook>;

// Plain all-reduce in the bucket's dtype, averaged (the default).
CommHookPtr allreduce_hook();

// As allreduce_hook(), but communicates even with one rank, as PyTorch's DDP does: for
// like-for-like world-1 comparisons and for tests that exercise a backend at world 1.
CommHookPtr always_allreduce_hook();

// Casts the bucket to float16 (pre-divided by the world size so the sum cannot overflow),
// all-reduces that, and casts back. Relative error about 1e-3 of the gradient. With one rank
// every hook leaves the bucket as it is (exact): there is nothing to communicate.
CommHookPtr fp16_compress_hook();

// As fp16_compress_hook with bfloat16: float32's range, about 1e-2 relative error.
CommHookPtr bf16_compress_hook();

}  // namespace ddp
