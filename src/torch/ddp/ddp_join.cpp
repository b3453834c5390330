// DistributedDataParallel as a Joinable (join.hpp). The collectives and their order follow
// PyTorch's DDP under torch.distributed.algorithms.Join, per iteration of a rank still training:
//   forward:  "not joined" all-reduce (Join::notify_join_context, when DDP is the first
//             Joinable), buffer broadcast from the highest rank still training (an all-reduce
//             MAX to agree on it, then the broadcast; when broadcast_buffers and buffers
//             exist), the "backward will sync" flag all-reduce;
//   backward: the bucket all-reduces (and the used-parameter all-reduce, the one-time rebuild).
// A joined rank issues the same with zeros. After every rank joined, all take the parameters
// and buffers of the highest-numbered rank among the last to join.

#include <fmt/format.h>

#include "ddp/torch/ddp/consistency.hpp"
#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/torch/nn/sync_batch_norm.hpp"
#include "ddp/util/error.hpp"

namespace ddp {
namespace {

// Result of an all-reduce of one int32 over the group, bounded by `timeout`.
int reduce_int(ProcessGroup& pg, int value, ReduceOp op, std::chrono::milliseconds timeout,
               const char* what) {
  auto t = torch::full({1}, value, torch::kInt32).to(comm_device(pg));
  try {
    WorkPtr work = all_reduce(pg, t, op);
    wait_on_current_stream(pg, *work, timeout);
  } catch (const TimeoutError& e) {
    throw TimeoutError(fmt::format("DDP under Join: the all-reduce of {} on rank {}: {}", what,
                                   pg.rank(), e.what()));
  }
  return t.cpu().item<int>();
}

}  // namespace

class DdpJoinHook : public JoinHook {
 public:
  DdpJoinHook(DistributedDataParallelBase& ddp, const JoinOptions& options) : ddp_(ddp) {
    ddp_.join_divide_by_initial_world_size_ = options.divide_by_initial_world_size();
  }
  // The guard is gone: averages go back to the plain world-size mean.
  ~DdpJoinHook() override {
    ddp_.reducer_->set_gradient_scale(1.0);
    ddp_.join_divide_by_initial_world_size_ = true;
  }
  void main_hook() override { ddp_.join_shadow_iteration(); }
  void post_hook(bool is_last_joiner) override { ddp_.join_sync_final_model(is_last_joiner); }

 private:
  DistributedDataParallelBase& ddp_;
};

std::unique_ptr<JoinHook> DistributedDataParallelBase::join_hook(const JoinOptions& options) {
  // A joined rank shadows the gradient all-reduces, not SyncBatchNorm's statistics all-reduce
  // in the forward: the ranks would then reduce different collectives. PyTorch documents
  // SyncBatchNorm as unsupported under Join; refused here, on every rank alike (each builds
  // its Join at the same point).
  for (const auto& item : base_->named_modules("", /*include_self=*/true)) {
    if (dynamic_cast<const SyncBatchNormBase*>(item.value().get()) != nullptr) {
      throw UsageError(fmt::format(
          "DDP under Join: module '{}' is a SyncBatchNorm, which Join does not support (a rank "
          "that ran out of inputs cannot take part in its statistics all-reduce; PyTorch does "
          "not support it either). Use BatchNorm inside Join, or give every rank the same "
          "number of batches (DistributedSampler pads the dataset; drop_last evens the last "
          "batch) and drop Join",
          item.key().empty() ? std::string("(the wrapped module)") : item.key()));
    }
  }
  return std::make_unique<DdpJoinHook>(*this, options);
}

int DistributedDataParallelBase::join_common_rank(bool candidate) {
  const int rank = reduce_int(*pg_, candidate ? pg_->rank() : -1, ReduceOp::kMax, timeout_,
                              "the authoritative rank");
  if (rank < 0) {
    throw ProtocolError(fmt::format(
        "DDP under Join: no rank offered itself as the authoritative copy (rank {}); the ranks "
        "disagree about who has joined",
        pg_->rank()));
  }
  return rank;
}

void DistributedDataParallelBase::join_before_forward() {
  const int training = Join::notify_join_context(*this);
  // Only when DDP issued the count (first Joinable) does it know how many ranks train, as in
  // PyTorch; otherwise the average stays over the initial world size.
  double scale = 1.0;
  if (training > 0 && !join_divide_by_initial_world_size_) {
    scale = static_cast<double>(pg_->size()) / training;
  }
  reducer_->set_gradient_scale(scale);
  if (options_.broadcast_buffers() && pg_->size() > 1 && !buffers_.empty()) {
    // Rank 0 may have joined already, its buffers stale: take the highest rank still training.
    broadcast_tensors(*pg_, buffers_, join_common_rank(true), timeout_);
  }
  const bool will_sync = reducer_->sync() && torch::GradMode::is_enabled();
  reduce_int(*pg_, will_sync ? 1 : 0, ReduceOp::kSum, timeout_, "the backward-sync flag");
}

void DistributedDataParallelBase::join_shadow_iteration() {
  if (options_.broadcast_buffers() && pg_->size() > 1 && !buffers_.empty()) {
    // Receives the buffers of a rank still training (this rank's are stale anyway).
    broadcast_tensors(*pg_, buffers_, join_common_rank(false), timeout_);
  }
  const int syncing = reduce_int(*pg_, 0, ReduceOp::kSum, timeout_, "the backward-sync flag");
  if (syncing == 0) return;  // the others run under no_sync (or without grad): no backward sync
  reducer_->shadow_backward_for_join();
}

void DistributedDataParallelBase::join_sync_final_model(bool is_last_joiner) {
  const int root = join_common_rank(is_last_joiner);
  std::vector<torch::Tensor> all;
  for (const auto& item : base_->named_parameters(true)) all.push_back(item.value());
  for (const auto& item : base_->named_buffers(true)) all.push_back(item.value());
  if (pg_->size() > 1 && !all.empty()) broadcast_tensors(*pg_, all, root, timeout_);
  reducer_->set_gradient_scale(1.0);
}

}  // namespace ddp
