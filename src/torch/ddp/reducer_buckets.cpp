// The Reducer's buckets: one flat buffer per bucket holding its members' gradients, built at
// construction, rebuilt once in the order of the first synchronized backward, and replaced
// when a failed iteration may leave a collective writing into the old one.

#include <fmt/format.h>

#include <algorithm>

#include "ddp/torch/ddp/bucketing.hpp"
#include "ddp/torch/ddp/reducer.hpp"
#include "ddp/torch/ddp/stop_request.hpp"
#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/util/error.hpp"
#include "static_graph.hpp"

namespace ddp {
namespace {

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

}  // namespace

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

// After a failed iteration: a collective that cannot be shown finished may still write into
// its buffer, so its reduction (which holds the buffer) is leaked and the bucket gets a fresh
// buffer. With gradient_as_bucket_view the next hook re-points param.grad() at it.
void Reducer::abandon_iteration_locked() {
  for (Bucket& bucket : buckets_) {
    if (!bucket.reduction) continue;
    bool done = false;
    try {
      // A staged launch still queued would issue its collective after this iteration ended.
      bucket.reduction->wait_launched(config_.timeout);
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

}  // namespace ddp
