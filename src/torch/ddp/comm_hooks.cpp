#include "ddp/torch/ddp/comm_hooks.hpp"

#include <fmt/format.h>

#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/util/error.hpp"
#include "host_staging.hpp"

namespace ddp {

std::vector<torch::Tensor> BucketInfo::gradients(const torch::Tensor& buffer) const {
  std::vector<torch::Tensor> out;
  out.reserve(offsets.size());
  for (size_t k = 0; k < offsets.size(); ++k) {
    int64_t numel = 1;
    for (int64_t d : shapes[k]) numel *= d;
    out.push_back(buffer.narrow(0, offsets[k], numel).view(shapes[k]));
  }
  return out;
}

std::unique_ptr<BucketReduction> CommHook::launch(ProcessGroup&, const torch::Tensor&) {
  throw UsageError(fmt::format(
      "communication hook '{}' overrides neither launch(pg, bucket) nor launch(pg, bucket, "
      "info); override one of them",
      name()));
}

std::unique_ptr<BucketReduction> CommHook::launch(ProcessGroup& pg, const torch::Tensor& bucket,
                                                  const BucketInfo&) {
  return launch(pg, bucket);
}

namespace {

// Reduces `wire` (a tensor of the hook's choice) and, at finish, writes it back into the
// bucket. When the bucket lives on a device the backend cannot address, `wire` is a host copy
// (see needs_host_staging). With nccl, the wait makes LibTorch's current CUDA stream wait for
// the collective, so the copy back (and everything after it) runs after it; the host does not
// block. A temporary `wire` may then be freed at once: all_reduce() recorded it on the
// communication stream, so the caching allocator does not reuse it before the collective ran.
class WireReduction : public BucketReduction {
 public:
  WireReduction(ProcessGroup& pg, torch::Tensor bucket, torch::Tensor wire, WorkPtr work)
      : pg_(pg), bucket_(std::move(bucket)), wire_(std::move(wire)), work_(std::move(work)) {}

  bool is_completed() override { return work_->is_completed(); }

  void finish(std::chrono::milliseconds timeout) override {
    wait_on_current_stream(pg_, *work_, timeout);
    // The wire tensor already holds the average; copy_ casts and moves across devices.
    if (!wire_.is_same(bucket_)) bucket_.copy_(wire_);
  }

 private:
  ProcessGroup& pg_;  // outlives the reduction (the Reducer holds it)
  torch::Tensor bucket_;
  torch::Tensor wire_;
  WorkPtr work_;
};

// With one rank the average is the bucket itself: nothing to send (saves the backend's copies).
class DoneReduction : public BucketReduction {
 public:
  bool is_completed() override { return true; }
  void finish(std::chrono::milliseconds) override {}
};

// The flight recorder's name of a bucket's collective (the Reducer's, for the staging thread).
std::string bucket_tag(const BucketInfo& info) {
  return fmt::format("DDP bucket {}, iteration {}", info.index, info.iteration + 1);
}

class AllReduceHook : public CommHook {
 public:
  explicit AllReduceHook(bool even_alone) : even_alone_(even_alone) {}
  std::string name() const override { return even_alone_ ? "always_allreduce" : "allreduce"; }
  std::unique_ptr<BucketReduction> launch(ProcessGroup& pg, const torch::Tensor& bucket,
                                          const BucketInfo& info) override {
    if (pg.size() == 1 && !even_alone_) return std::make_unique<DoneReduction>();
    if (needs_host_staging(bucket, pg) && overlapped_host_staging()) {
      return launch_staged_all_reduce(pg, bucket, bucket, ReduceOp::kAvg, bucket_tag(info));
    }
    if (!bucket.is_cuda()) {
      auto queued = launch_behind_staged(pg, bucket, bucket, ReduceOp::kAvg, bucket_tag(info));
      if (queued) return queued;
    }
    return launch(pg, bucket);
  }
  std::unique_ptr<BucketReduction> launch(ProcessGroup& pg, const torch::Tensor& bucket) override {
    if (pg.size() == 1 && !even_alone_) return std::make_unique<DoneReduction>();
    torch::Tensor wire = needs_host_staging(bucket, pg) ? pinned_host_copy(bucket) : bucket;
    WorkPtr work = all_reduce(pg, wire, ReduceOp::kAvg);
    return std::make_unique<WireReduction>(pg, bucket, wire, std::move(work));
  }

 private:
  bool even_alone_;
};

class CompressHook : public CommHook {
 public:
  CompressHook(c10::ScalarType type, std::string name) : type_(type), name_(std::move(name)) {}
  std::string name() const override { return name_; }
  std::unique_ptr<BucketReduction> launch(ProcessGroup& pg, const torch::Tensor& bucket,
                                          const BucketInfo& info) override {
    if (pg.size() == 1) return std::make_unique<DoneReduction>();
    torch::Tensor wire = compressed(pg, bucket);
    if (needs_host_staging(wire, pg) && overlapped_host_staging()) {
      return launch_staged_all_reduce(pg, bucket, wire, ReduceOp::kSum, bucket_tag(info));
    }
    if (!wire.is_cuda()) {
      auto queued = launch_behind_staged(pg, bucket, wire, ReduceOp::kSum, bucket_tag(info));
      if (queued) return queued;
    }
    return reduce(pg, bucket, std::move(wire));
  }
  std::unique_ptr<BucketReduction> launch(ProcessGroup& pg, const torch::Tensor& bucket) override {
    if (pg.size() == 1) return std::make_unique<DoneReduction>();
    return reduce(pg, bucket, compressed(pg, bucket));
  }

 private:
  // All-reduces `wire` (the compressed bucket; through a pinned host copy on a host backend).
  static std::unique_ptr<BucketReduction> reduce(ProcessGroup& pg, const torch::Tensor& bucket,
                                                 torch::Tensor wire) {
    if (needs_host_staging(wire, pg)) wire = pinned_host_copy(wire);
    WorkPtr work = all_reduce(pg, wire, ReduceOp::kSum);
    return std::make_unique<WireReduction>(pg, bucket, wire, std::move(work));
  }

  // Dividing before the cast keeps the float16 sum of size() ranks inside its range.
  torch::Tensor compressed(const ProcessGroup& pg, const torch::Tensor& bucket) const {
    return bucket.div(pg.size()).to(type_);
  }

  c10::ScalarType type_;
  std::string name_;
};

}  // namespace

CommHookPtr allreduce_hook() {
  return std::make_shared<AllReduceHook>(false);
}
CommHookPtr always_allreduce_hook() {
  return std::make_shared<AllReduceHook>(true);
}
CommHookPtr fp16_compress_hook() {
  return std::make_shared<CompressHook>(c10::ScalarType::Half, "fp16_compress");
}
CommHookPtr bf16_compress_hook() {
  return std::make_shared<CompressHook>(c10::ScalarType::BFloat16, "bf16_compress");
}

}  // namespace ddp
