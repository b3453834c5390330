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
#include <vector>

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
  // Returns once every collective of this reduction was issued to the group (bounded by
  // timeout). Most reductions issue them in launch(); a host-staged CUDA bucket issues its
  // all-reduce later, on the staging thread, once its copy to the host completed
  // (host_staging.hpp). DDP calls this before it issues a collective of its own in the same
  // iteration, so every rank issues them in the same order.
  virtual void wait_launched(std::chrono::milliseconds timeout) { (void)timeout; }
};

// What DDP tells a hook about a bucket besides its flat buffer, like PyTorch's GradBucket:
// its place among the buckets, the iteration, and where each member parameter's gradient
// lies in the buffer. Hooks that compress per parameter or keep state per bucket (PowerSGD)
// need it; the layout of a bucket can change once, when DDP rebuilds the buckets at the end
// of the first synchronized backward (state kept per bucket index must not outlive that).
struct BucketInfo {
  size_t index = 0;              // launch order: bucket 0 is launched first in every backward
  size_t bucket_count = 1;       // buckets in this model
  int64_t iteration = 0;         // synchronized backwards before this one (0 in the first)
  std::vector<int64_t> offsets;  // per member: first element in the buffer
  std::vector<std::vector<int64_t>> shapes;  // per member: the parameter's shape
  std::vector<std::string> names;            // per member: the parameter's name

  // The bucket launched last in an iteration (PyTorch's GradBucket::is_last()).
  bool is_last() const { return index + 1 == bucket_count; }
  // The members' gradients as views into `buffer` (the bucket, or a same-sized copy of it),
  // shaped like the parameters: writing into them writes into the buffer.
  std::vector<torch::Tensor> gradients(const torch::Tensor& buffer) const;
};

class CommHook {
 public:
  virtual ~CommHook() = default;
  virtual std::string name() const = 0;
  // The flat bucket alone: hooks that treat it as one vector override this one. The default
  // throws UsageError (a hook must override one of the two).
  virtual std::unique_ptr<BucketReduction> launch(ProcessGroup& pg, const torch::Tensor& bucket);
  // What DDP calls. The default calls launch(pg, bucket); hooks that need the bucket's
  // layout or keep state per bucket override this one.
  virtual std::unique_ptr<BucketReduction> launch(ProcessGroup& pg, const torch::Tensor& bucket,
                                                  const BucketInfo& info);
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
