// The Reducer's part in Join (join.hpp): what a rank that ran out of inputs does in each
// backward of the ranks still training. Kept apart from reducer_backward.cpp: it shares no code
// path with a real backward, only the order of collectives.

#include <fmt/format.h>

#include "ddp/torch/ddp/reducer.hpp"
#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/util/error.hpp"
#include "static_graph.hpp"

namespace ddp {

void Reducer::set_gradient_scale(double scale) {
  std::lock_guard<std::mutex> lock(mutex_);
  gradient_scale_ = scale;
}

// The ranks still training launch bucket 0, 1, ... (each through the comm hook), then, with
// find_unused_parameters, the used-parameter all-reduce, and after their first synchronized
// backward the bucket-order broadcast; this issues the same, in the same order. The zero
// buffers are fresh tensors: with gradient_as_bucket_view the bucket buffers are this rank's
// param.grad(), which must not change.
void Reducer::shadow_backward_for_join() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (in_backward_) {
    throw UsageError(fmt::format(
        "Join: rank {} joined in the middle of a backward (its gradients were not averaged "
        "yet); leave the Join guard's scope only after backward and the optimizer step",
        pg_->rank()));
  }
  torch::NoGradGuard no_grad;
  // This shadow stands for one synchronized backward: hooks see the same iteration number
  // (and bucket layout) as on the ranks still training.
  ++iteration_;
  std::vector<torch::Tensor> zeros;
  std::vector<std::unique_ptr<BucketReduction>> reductions;
  size_t b = 0;
  try {
    for (; b < buckets_.size(); ++b) {
      zeros.push_back(torch::zeros_like(buckets_[b].buffer));
      buckets_[b].info.iteration = iteration_ - 1;
      reductions.push_back(config_.comm_hook->launch(*pg_, zeros.back(), buckets_[b].info));
    }
    torch::Tensor unused;
    WorkPtr used_work;
    // As finalize_locked: with static_graph only in the first iteration (and then this rank's
    // own counts, all zero, become final: if it trains again later, its hooks report the
    // changed graph instead of desynchronizing the collectives).
    const bool counting = static_graph_ && static_graph_->counting();
    if (static_graph_ ? counting : config_.find_unused_parameters) {
      // After the buckets' all-reduces, including those still being staged (as finalize).
      for (auto& reduction : reductions) reduction->wait_launched(config_.timeout);
      unused =
          torch::zeros({static_cast<int64_t>(params_.size())}, torch::kInt32).to(comm_device(*pg_));
      used_work = all_reduce(*pg_, unused, ReduceOp::kSum);
    }
    for (b = 0; b < reductions.size(); ++b) reductions[b]->finish(config_.timeout);
    if (used_work) wait_on_current_stream(*pg_, *used_work, config_.timeout);
    if (counting) {
      torch::Tensor used = unused.cpu();
      static_global_used_.assign(used.data_ptr<int32_t>(),
                                 used.data_ptr<int32_t>() + params_.size());
      static_graph_->finish_counting();
    }
    end_straggler_iteration_locked();  // the training ranks' straggler exchange, when due
  } catch (const TimeoutError& e) {
    // The reductions may still write into `zeros`; keep both alive rather than free memory
    // a collective could still use.
    for (auto& r : reductions) (void)r.release();
    for (auto& z : zeros) (void)new torch::Tensor(z);
    throw TimeoutError(fmt::format(
        "Join: rank {} (joined) shadowing bucket {}'s all-reduce: {}. The ranks still training "
        "must issue the same collectives: the same model, DDP options and comm hook on every "
        "rank",
        pg_->rank(), b, e.what()));
  }
  if (!buckets_rebuilt_) rebuild_buckets_locked();
}

}  // namespace ddp
