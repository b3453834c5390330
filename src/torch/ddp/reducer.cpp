#include "ddp/torch/ddp/reducer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <unordered_set>

#include "ddp/torch/ddp/bucketing.hpp"
#include "ddp/torch/ddp/stop_request.hpp"
#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"
#include "output_sink.hpp"
#include "static_graph.hpp"

namespace ddp {
namespace {

// Runs `fn` after the AccumulateGrad node it is attached to has accumulated the gradient.
class ReadyHook : public torch::autograd::FunctionPostHook {
 public:
  explicit ReadyHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(
      const torch::autograd::variable_list& outputs,
      const torch::autograd::variable_list& /*inputs*/) override {
    fn_();
    return outputs;
  }

 private:
  std::function<void()> fn_;
};

// A tensor sharing `buffer`'s storage at `offset`, shaped like `like`. Made with set_ rather
// than narrow/view so autograd does not treat it as a view: optimizers may detach_() and
// zero_() it in place when it serves as param.grad().
torch::Tensor slice_of(const torch::Tensor& buffer, int64_t offset, const torch::Tensor& like) {
  torch::NoGradGuard no_grad;
  auto t = torch::empty({0}, buffer.options());
  t.set_(buffer.storage(), buffer.storage_offset() + offset, like.sizes(),
         c10::contiguous_strides(like.sizes()));
  return t;
}

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

Reducer::Reducer(std::vector<torch::Tensor> params, std::vector<std::string> names,
                 ProcessGroupPtr pg, ReducerConfig config)
    : params_(std::move(params)),
      names_(std::move(names)),
      pg_(std::move(pg)),
      config_(std::move(config)),
      stragglers_(config_.straggler_window) {
  has_user_comm_hook_ = config_.comm_hook != nullptr;
  if (!config_.comm_hook) config_.comm_hook = allreduce_hook();
  const size_t n = params_.size();
  std::vector<BucketParam> sizes(n);
  for (size_t i = 0; i < n; ++i) {
    const torch::Tensor& p = params_[i];
    const std::string what = fmt::format("parameter '{}'", names_[i]);
    if (!p.requires_grad() || !p.is_leaf()) {
      throw UsageError(
          fmt::format("{} must be a leaf tensor that requires grad to be averaged by DDP", what));
    }
    if (p.layout() != c10::kStrided) {
      throw UsageError(fmt::format("{} is sparse; DDP averages dense parameters only", what));
    }
    if (!to_data_type(p.scalar_type())) {
      throw UsageError(fmt::format(
          "{} has dtype {}, which DDP cannot all-reduce; use float32/float64/float16/bfloat16",
          what, c10::toString(p.scalar_type())));
    }
    sizes[i].bytes = static_cast<size_t>(p.numel()) * p.element_size();
    sizes[i].group = std::string(c10::toString(p.scalar_type())) + "@" + p.device().str();
  }

  if (config_.static_graph) static_graph_ = std::make_unique<StaticGraph>(n);
  sizes_ = std::move(sizes);
  build_buckets(assign_buckets(sizes_, config_.first_bucket_cap_bytes, config_.bucket_cap_bytes));

  ready_.assign(n, false);
  locally_used_.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    auto acc = torch::autograd::impl::grad_accumulator(params_[i]);
    if (!acc) {
      throw UsageError(fmt::format("parameter '{}' has no gradient accumulator", names_[i]));
    }
    hook_keys_.push_back(
        acc->add_post_hook(std::make_unique<ReadyHook>([this, i] { on_gradient_ready(i); })));
    accumulators_.push_back(std::move(acc));
  }
}

Reducer::~Reducer() {
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    accumulators_[i]->del_post_hook(hook_keys_[i]);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  abandon_iteration_locked();
}

// Allocates a flat buffer per bucket and a view per member. With gradient_as_bucket_view every
// defined gradient is copied into its new view and param.grad() re-pointed at it, both at
// construction and when the buckets are rebuilt (the old buffers are then released).
void Reducer::build_buckets(const std::vector<std::vector<size_t>>& assignment) {
  std::vector<Bucket> buckets;
  locator_.assign(params_.size(), {0, 0});
  for (const auto& members : assignment) {
    Bucket bucket;
    bucket.params = members;
    // The stop request's flag rides at the end of the bucket launched last (stop_request.hpp).
    const bool carries_stop = config_.stop_request && buckets.size() + 1 == assignment.size();
    int64_t total = carries_stop ? 1 : 0;
    for (size_t i : members) total += params_[i].numel();
    bucket.buffer = torch::zeros({total}, params_[members.front()].options().requires_grad(false));
    int64_t offset = 0;
    bucket.info.index = buckets.size();
    bucket.info.bucket_count = assignment.size();
    for (size_t slot = 0; slot < members.size(); ++slot) {
      const size_t i = members[slot];
      bucket.info.offsets.push_back(offset);
      bucket.info.shapes.push_back(params_[i].sizes().vec());
      bucket.info.names.push_back(names_[i]);
      bucket.views.push_back(slice_of(bucket.buffer, offset, params_[i]));
      offset += params_[i].numel();
      locator_[i] = {buckets.size(), slot};
      if (config_.gradient_as_bucket_view && params_[i].grad().defined()) {
        torch::NoGradGuard no_grad;
        bucket.views.back().copy_(params_[i].grad());
        params_[i].mutable_grad() = bucket.views.back();
      }
    }
    if (carries_stop) {
      bucket.info.offsets.push_back(offset);
      bucket.info.shapes.push_back({1});
      bucket.info.names.push_back(StopRequest::kStopRequestMember);
    }
    bucket.pending = members.size();
    buckets.push_back(std::move(bucket));
  }
  buckets_ = std::move(buckets);
}

// Once, after the first synchronized backward: buckets follow the order in which gradients
// became ready on rank 0 (broadcast, so every rank builds the same buckets and issues the same
// collectives). Registration order is only a guess at backward's order; a module whose
// forward uses its submodules in another order would otherwise launch its first bucket last
// and overlap nothing. Parameters that got no gradient in that backward go last.
void Reducer::rebuild_buckets_locked() {
  buckets_rebuilt_ = true;
  const size_t n = params_.size();
  std::vector<int64_t> order;
  std::vector<bool> listed(n, false);
  // A parameter is ready at its last firing (several only with static_graph).
  for (auto it = ready_order_.rbegin(); it != ready_order_.rend(); ++it) {
    if (listed[*it]) continue;
    order.push_back(static_cast<int64_t>(*it));
    listed[*it] = true;
  }
  std::reverse(order.begin(), order.end());
  for (size_t i = n; i-- > 0;) {
    if (!listed[i]) order.push_back(static_cast<int64_t>(i));
  }
  ready_order_.clear();
  if (pg_->size() > 1) {
    auto wire = torch::tensor(order, torch::kInt64).to(comm_device(*pg_));
    FlightRecorder::ScopedThreadTag tag(fmt::format("DDP bucket order, iteration {}", iteration_));
    WorkPtr work = broadcast(*pg_, wire, /*root=*/0);
    wait_on_current_stream(*pg_, *work, config_.timeout);
    wire = wire.cpu();
    std::copy(wire.data_ptr<int64_t>(), wire.data_ptr<int64_t>() + n, order.begin());
  }
  std::vector<size_t> permutation;
  std::vector<bool> seen(n, false);
  for (int64_t v : order) {
    if (v < 0 || static_cast<size_t>(v) >= n || seen[v]) {
      throw ProtocolError(fmt::format(
          "DDP: rank 0 sent an invalid gradient order (entry {} for {} parameters); the ranks "
          "disagree about the model",
          v, n));
    }
    seen[v] = true;
    permutation.push_back(static_cast<size_t>(v));
  }
  auto assignment =
      assign_buckets(sizes_, permutation, config_.first_bucket_cap_bytes, config_.bucket_cap_bytes);
  bool same = assignment.size() == buckets_.size();
  for (size_t b = 0; same && b < assignment.size(); ++b) same = assignment[b] == buckets_[b].params;
  if (!same) build_buckets(assignment);
}

void Reducer::set_sync(bool sync) {
  std::lock_guard<std::mutex> lock(mutex_);
  sync_ = sync;
}

bool Reducer::sync() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sync_;
}

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

// After a failed iteration: a collective that cannot be shown finished may still write into
// its buffer, so its reduction (which holds the buffer) is leaked and the bucket gets a fresh
// buffer. With gradient_as_bucket_view the next hook re-points param.grad() at it.
void Reducer::abandon_iteration_locked() {
  for (Bucket& bucket : buckets_) {
    if (!bucket.reduction) continue;
    bool done = false;
    try {
      done = bucket.reduction->is_completed();
    } catch (...) {
    }
    if (!done) {
      (void)bucket.reduction.release();
      bucket.buffer = torch::zeros_like(bucket.buffer);
      int64_t offset = 0;
      for (size_t slot = 0; slot < bucket.params.size(); ++slot) {
        bucket.views[slot] = slice_of(bucket.buffer, offset, params_[bucket.params[slot]]);
        offset += params_[bucket.params[slot]].numel();
      }
    }
    bucket.reduction.reset();
  }
  reset_iteration_locked();
  ready_order_.clear();  // a failed backward's partial order says little; record the next one
  // A first backward that failed counted only part of the graph: count the next one afresh.
  if (static_graph_ && static_graph_->counting()) {
    static_graph_ = std::make_unique<StaticGraph>(params_.size());
  }
}

int64_t Reducer::unused_parameter_searches() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return unused_parameter_searches_;
}

std::vector<std::vector<std::string>> Reducer::bucket_names() const {
  std::lock_guard<std::mutex> lock(mutex_);  // the rebuild replaces buckets_ during a backward
  std::vector<std::vector<std::string>> out;
  for (const Bucket& bucket : buckets_) {
    out.emplace_back();
    for (size_t i : bucket.params) out.back().push_back(names_[i]);
  }
  return out;
}

}  // namespace ddp
