// The Reducer while backward runs: the forward's decision whether the backward is synchronized,
// the search for unused parameters in the outputs' graph, the hooks marking gradients ready and
// the launch of full buckets, strictly in index order.

#include <fmt/format.h>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <unordered_set>

#include "ddp/torch/ddp/reducer.hpp"
#include "ddp/torch/ddp/stop_request.hpp"
#include "ddp/util/error.hpp"
#include "output_sink.hpp"
#include "static_graph.hpp"

namespace ddp {

std::vector<torch::Tensor> Reducer::prepare_for_backward(
    const std::vector<torch::Tensor>& outputs) {
  bool sync;
  bool sink;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    sync = sync_;
    forward_sync_ = sync;
    known_unused_.clear();
    // static_graph's first backward reduces everything when it ends, so it must end with the
    // outermost backward, not with a reentrant one inside it.
    sink = sync && static_graph_ && static_graph_->counting();
  }
  // Under no_sync nothing is reduced; the synchronized backward finds its own unused ones.
  // With static_graph the unused parameters are those of the first backward: no search.
  if (sync && config_.find_unused_parameters && !config_.static_graph) {
    mark_unused_from_outputs(outputs);
  }
  if (!sink) return {};
  std::weak_ptr<char> alive = alive_;
  return pass_through_sink(outputs, [this, alive] {
    if (alive.lock()) on_outputs_backward();
  });
}

void Reducer::on_outputs_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!in_backward_ && !in_local_backward_) (void)start_backward_locked();
}

void Reducer::mark_unused_from_outputs(const std::vector<torch::Tensor>& outputs) {
  std::unordered_set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack;
  for (const auto& out : outputs) {
    if (!out.defined() || !out.requires_grad()) continue;
    auto fn = torch::autograd::impl::gradient_edge(out).function;
    if (fn && seen.insert(fn.get()).second) stack.push_back(fn.get());
  }
  while (!stack.empty()) {
    torch::autograd::Node* node = stack.back();
    stack.pop_back();
    for (const auto& edge : node->next_edges()) {
      if (edge.function && seen.insert(edge.function.get()).second) {
        stack.push_back(edge.function.get());
      }
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  ++unused_parameter_searches_;
  known_unused_.clear();
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    if (!seen.count(accumulators_[i].get())) known_unused_.push_back(i);
  }
}

void Reducer::on_gradient_ready(size_t index) {
  std::lock_guard<std::mutex> lock(mutex_);
  locally_used_[index] = 1;
  if (!in_backward_ && !in_local_backward_ && !start_backward_locked()) return;
  if (in_local_backward_) return;
  if (static_graph_) {
    if (static_graph_->counting()) {
      // When a gradient is complete is known only when this first backward ends.
      static_graph_->count(index);
      if (!buckets_rebuilt_) ready_order_.push_back(index);
      return;
    }
    if (!static_graph_->arrive(index, names_, pg_->rank(), iteration_)) return;
  } else if (ready_[index]) {
    throw UsageError(fmt::format(
        "DDP: parameter '{}' received a gradient twice in one backward on rank {}; DDP averages "
        "one backward per iteration: call backward once per forward (accumulate over several "
        "with no_sync()), or, when the parameter is used several times in every iteration (a "
        "shared module, activation checkpointing), pass "
        "DistributedDataParallelOptions().static_graph(true)",
        names_[index], pg_->rank()));
  }
  if (!buckets_rebuilt_) ready_order_.push_back(index);
  mark_ready_locked(index);
  launch_ready_buckets_locked();
  if (config_.timeline) poll_completions_locked();
}

bool Reducer::start_backward_locked() {
  const bool sync = forward_sync_.value_or(sync_);
  forward_sync_.reset();
  if (sync) {
    begin_backward_locked();
    return true;
  }
  // Nothing to reduce, but the end of this backward must be known: until then its later
  // gradients belong to it, not to a new backward with a new decision.
  in_local_backward_ = true;
  torch::autograd::Engine::get_default_engine().queue_callback([this] {
    std::lock_guard<std::mutex> lock(mutex_);
    in_local_backward_ = false;
  });
  return false;
}

void Reducer::begin_backward_locked() {
  in_backward_ = true;
  ++iteration_;
  backward_begin_ = Timeline::Clock::now();
  if (static_graph_ && !static_graph_->counting()) {
    // The final callback is queued when the last bucket is launched (every gradient is then
    // complete), from whichever backward that happens in: the first hook may run inside a
    // reentrant backward, which ends before ours.
    static_graph_->reset();
    for (size_t i : static_graph_->unused()) mark_ready_locked(i);
  } else {
    // Runs once the engine has finished this backward, on the thread that ran it.
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
    finalize_queued_ = true;
    for (size_t i : known_unused_) {
      if (!ready_[i]) mark_ready_locked(i);
    }
  }
  known_unused_.clear();
}

void Reducer::mark_ready_locked(size_t index) {
  auto [b, slot] = locator_[index];
  Bucket& bucket = buckets_[b];
  torch::Tensor& view = bucket.views[slot];
  torch::Tensor& param = params_[index];
  const torch::Tensor& grad = param.grad();
  torch::NoGradGuard no_grad;
  if (!grad.defined()) {
    view.zero_();
  } else {
    if (grad.layout() != c10::kStrided) {
      throw UsageError(fmt::format(
          "DDP: parameter '{}' got a sparse gradient; DDP averages dense gradients only (build "
          "the embedding with sparse=false)",
          names_[index]));
    }
    if (grad.data_ptr() != view.data_ptr()) {
      view.copy_(grad);
      if (config_.gradient_as_bucket_view) param.mutable_grad() = view;
    }
  }
  ready_[index] = true;
  --bucket.pending;
}

void Reducer::launch_ready_buckets_locked() {
  while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].pending == 0) {
    Bucket& bucket = buckets_[next_bucket_++];
    bucket.launched_at = Timeline::Clock::now();
    bucket.completion_recorded = false;
    // The flight recorder names the bucket and iteration of each collective the hook issues.
    FlightRecorder::ScopedThreadTag tag(
        fmt::format("DDP bucket {}, iteration {}", next_bucket_ - 1, iteration_));
    try {
      bucket.info.iteration = iteration_ - 1;
      if (config_.stop_request && bucket.info.is_last()) {
        bucket.buffer.narrow(0, bucket.buffer.numel() - 1, 1)
            .fill_(config_.stop_request->outgoing());
      }
      const auto begin = Timeline::Clock::now();
      bucket.reduction = config_.comm_hook->launch(*pg_, bucket.buffer, bucket.info);
      // A small bucket may be reduced inline: the launch then blocks until every peer joined.
      const auto end = Timeline::Clock::now();
      stragglers_.add_wait(end - begin);
      if (config_.timeline && end - begin >= std::chrono::milliseconds(1)) {
        config_.timeline->add_span("wait for peers", Timeline::Track::kCompute, begin, end);
      }
    } catch (...) {
      // Small buckets may reduce inline, so a peer that is missing shows up here.
      rethrow_with_iteration_context(fmt::format("bucket {}'s all-reduce", next_bucket_ - 1));
    }
  }
  if (in_backward_ && !finalize_queued_ && next_bucket_ == buckets_.size()) {
    finalize_queued_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finalize(); });
  }
}

void Reducer::rethrow_with_iteration_context(const std::string& what) const {
  try {
    throw;
  } catch (const TimeoutError& e) {
    throw TimeoutError(fmt::format(
        "DDP: {} in iteration {} did not finish on rank {}: "
        "{}. In a training loop this usually means the ranks run different numbers of "
        "iterations (one ran out of data, left the loop or exited): give every rank the same "
        "number of batches (DistributedSampler pads the dataset to a multiple of the world "
        "size; drop_last keeps the last batch from differing)",
        what, iteration_, pg_->rank(), e.what()));
  }
}

// Completion is observed, not signalled: a span ends at the first poll that sees it done.
void Reducer::poll_completions_locked() {
  for (size_t b = 0; b < next_bucket_; ++b) {
    Bucket& bucket = buckets_[b];
    if (bucket.reduction && !bucket.completion_recorded && bucket.reduction->is_completed()) {
      bucket.completion_recorded = true;
      config_.timeline->add_span(fmt::format("allreduce bucket {}", b), Timeline::Track::kComm,
                                 bucket.launched_at, Timeline::Clock::now());
    }
  }
}

}  // namespace ddp
