// The end of a synchronized backward (the autograd engine's final callback, or finalize()):
// every bucket waited for, the averages written back into param.grad(), the unused parameters
// agreed on by all ranks, and the iteration's state reset.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "ddp/torch/ddp/reducer.hpp"
#include "ddp/torch/ddp/stop_request.hpp"
#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"
#include "static_graph.hpp"

namespace ddp {
namespace {

std::string join_names(const std::vector<std::string>& names, const std::vector<size_t>& which,
                       size_t limit) {
  std::string out;
  for (size_t k = 0; k < which.size() && k < limit; ++k) {
    if (k) out += ", ";
    out += "'" + names[which[k]] + "'";
  }
  if (which.size() > limit) out += fmt::format(" and {} more", which.size() - limit);
  return out;
}

}  // namespace

void Reducer::finalize() {
  std::lock_guard<std::mutex> lock(mutex_);
  in_local_backward_ = false;
  if (in_backward_) finalize_locked();
}

void Reducer::finalize_locked() {
  finalize_queued_ = true;  // may run outside the engine: queue no callback from here on
  // static_graph: the first backward only counted; a later one must match its counts.
  const bool counting = static_graph_ && static_graph_->counting();
  std::vector<std::string> changed;
  if (static_graph_ && !counting) changed = static_graph_->incomplete(names_);
  std::vector<size_t> missing;
  for (size_t i = 0; i < ready_.size(); ++i) {
    if (!ready_[i]) missing.push_back(i);
  }
  // Missing gradients still go out (as zeros) so that peers' collectives complete and no rank
  // hangs; without find_unused_parameters the iteration then fails with the names.
  for (size_t i : missing) mark_ready_locked(i);
  launch_ready_buckets_locked();

  torch::Tensor global_used;
  WorkPtr used_work;
  // Which parameters some rank used: every iteration with find_unused_parameters; with
  // static_graph once, in the first iteration, then remembered.
  if (static_graph_ ? counting : config_.find_unused_parameters) {
    // After the buckets' all-reduces on every rank, including those still being staged.
    size_t staged = 0;
    try {
      for (; staged < buckets_.size(); ++staged) {
        buckets_[staged].reduction->wait_launched(config_.timeout);
      }
    } catch (...) {
      abandon_iteration_locked();
      rethrow_with_iteration_context(fmt::format("bucket {}'s all-reduce", staged));
    }
    // On the group's device (the GPU for nccl); read back on the host after the wait.
    global_used = torch::tensor(locally_used_, torch::kInt32).to(comm_device(*pg_));
    FlightRecorder::ScopedThreadTag tag(
        fmt::format("DDP used-parameter counts, iteration {}", iteration_));
    used_work = all_reduce(*pg_, global_used, ReduceOp::kSum);
  }
  size_t finishing = 0;
  const auto wait_begin = Timeline::Clock::now();
  try {
    for (; finishing < buckets_.size(); ++finishing) {
      Bucket& bucket = buckets_[finishing];
      bucket.reduction->finish(config_.timeout);
      bucket.reduction.reset();
      // Join, see header. As in PyTorch, only without a comm hook: a hook's result is final.
      if (gradient_scale_ != 1.0 && !has_user_comm_hook_) bucket.buffer.mul_(gradient_scale_);
      if (config_.timeline && !bucket.completion_recorded) {
        config_.timeline->add_span(fmt::format("allreduce bucket {}", finishing),
                                   Timeline::Track::kComm, bucket.launched_at,
                                   Timeline::Clock::now());
      }
    }
    if (used_work) {
      wait_on_current_stream(*pg_, *used_work, config_.timeout);
      global_used = global_used.cpu();
    }
    const auto wait_end = Timeline::Clock::now();
    stragglers_.add_wait(wait_end - wait_begin);
    if (config_.timeline) {
      config_.timeline->add_span("wait for peers", Timeline::Track::kCompute, wait_begin, wait_end);
    }
    ++finishing;  // past the used-parameter counts: names the statistics below if they fail
    end_straggler_iteration_locked();
    if (config_.stop_request) {
      const torch::Tensor& last = buckets_.back().buffer;
      config_.stop_request->incoming(last.narrow(0, last.numel() - 1, 1).clone(), iteration_);
    }
  } catch (...) {
    abandon_iteration_locked();
    rethrow_with_iteration_context(
        finishing < buckets_.size()    ? fmt::format("bucket {}'s all-reduce", finishing)
        : finishing == buckets_.size() ? std::string("the all-reduce of the used-parameter counts")
                                       : std::string("the straggler statistics' all-reduce"));
  }

  torch::NoGradGuard no_grad;
  const int32_t* used = global_used.defined() ? global_used.data_ptr<int32_t>() : nullptr;
  if (static_graph_) {
    if (counting) {
      static_global_used_.assign(used, used + params_.size());
      static_graph_->finish_counting();
    }
    used = static_global_used_.data();
  } else if (used && !unused_option_checked_) {
    unused_option_checked_ = true;
    warn_if_unused_option_is_unneeded(used);
  }
  for (Bucket& bucket : buckets_) {
    for (size_t slot = 0; slot < bucket.params.size(); ++slot) {
      const size_t i = bucket.params[slot];
      torch::Tensor& grad = params_[i].mutable_grad();
      const torch::Tensor& view = bucket.views[slot];
      if (grad.defined()) {
        if (grad.data_ptr() != view.data_ptr()) grad.copy_(view);
      } else if (!used || used[i] > 0) {
        // Another rank produced a gradient for it: this rank receives the average too.
        grad = config_.gradient_as_bucket_view ? view : view.clone();
      }
    }
  }
  if (config_.timeline) {
    config_.timeline->add_span("backward", Timeline::Track::kCompute, backward_begin_,
                               Timeline::Clock::now());
  }
  reset_iteration_locked();
  // Every rank reaches this point in its first synchronized backward (even one about to
  // report missing gradients below), so the broadcast inside is matched on every rank.
  if (!buckets_rebuilt_) rebuild_buckets_locked();

  if (!changed.empty()) {
    throw UsageError(fmt::format(
        "DDP static_graph: {} parameter(s) received fewer gradients in iteration {} on rank {} "
        "than in the first iteration: {}. The autograd graph changed, which static_graph(true) "
        "promised it would not; turn static_graph off (with find_unused_parameters(true) for "
        "parameters used only in some iterations)",
        changed.size(), iteration_, pg_->rank(), fmt::join(changed, ", ")));
  }
  if (!missing.empty() && !config_.find_unused_parameters && !static_graph_) {
    throw UsageError(fmt::format(
        "DDP: {} parameter(s) received no gradient in this backward on rank {}: {}. DDP must "
        "know when every gradient is ready; make every parameter take part in the loss, or "
        "pass DistributedDataParallelOptions().find_unused_parameters(true) when some are "
        "legitimately unused (conditional branches, frozen heads)",
        missing.size(), pg_->rank(), join_names(names_, missing, 10)));
  }
}

// Every rank calls this once per synchronized backward, a joined rank from its shadow backward
// too (reducer_join.cpp), so the window's exchange is issued by every rank at the same point.
void Reducer::end_straggler_iteration_locked() {
  stragglers_.end_iteration(*pg_, iteration_, [&](std::vector<double>& sums) {
    FlightRecorder::ScopedThreadTag tag(
        fmt::format("DDP straggler statistics, iteration {}", iteration_));
    auto wire = torch::tensor(sums, torch::kFloat64).to(comm_device(*pg_));
    WorkPtr work = all_reduce(*pg_, wire, ReduceOp::kSum);
    wait_on_current_stream(*pg_, *work, config_.timeout);
    wire = wire.cpu();
    std::copy(wire.data_ptr<double>(), wire.data_ptr<double>() + sums.size(), sums.begin());
  });
}

void Reducer::warn_if_unused_option_is_unneeded(const int32_t* global_used) const {
  if (pg_->rank() != 0) return;  // every rank holds the same counts; one warning is enough
  for (size_t i = 0; i < params_.size(); ++i) {
    if (global_used[i] == 0) return;
  }
  log::get("ddp.ddp")->warn(
      "find_unused_parameters is on, but every parameter received a gradient in the "
      "first iteration. The option costs a walk of the autograd graph after every "
      "forward and an extra all-reduce after every backward; turn it off unless some "
      "parameters go unused in later iterations (conditional branches)");
}

void Reducer::reset_iteration_locked() {
  in_backward_ = false;
  finalize_queued_ = false;
  next_bucket_ = 0;
  std::fill(ready_.begin(), ready_.end(), false);
  std::fill(locally_used_.begin(), locally_used_.end(), 0);
  known_unused_.clear();
  for (Bucket& bucket : buckets_) bucket.pending = bucket.params.size();
}

}  // namespace ddp
