#pragma once
// DistributedDataParallel: data-parallel training of any torch::nn::Module over a
// ddp::ProcessGroup, like torch.nn.parallel.DistributedDataParallel.
//
//   auto pg = ddp::init_process_group(...);
//   auto net = std::make_shared<Net>();               // or a ModuleHolder: Net net;
//   ddp::DistributedDataParallel model(net, pg);       // checks and broadcasts rank 0's state
//   torch::optim::Adam opt(model.parameters(), 1e-3);
//   for (auto& batch : loader) {
//     opt.zero_grad();
//     auto loss = torch::nll_loss(model(batch.data), batch.target);  // = net->forward(...)
//     loss.backward();        // buckets are all-reduced while backward runs
//     model.step(opt);        // or opt.step(): gradients already hold the average
//   }
//
// Construction is collective: every rank must wrap a model with the same parameter names,
// shapes and dtypes (else a UsageError names the first difference and the ranks), and ends
// with rank 0's parameters and buffers on every rank.
//
// forward()/operator() call the module's own forward with the caller's arguments and types,
// after broadcasting buffers (broadcast_buffers), and then record whether the backward of
// this forward all-reduces (no_sync's state now, as PyTorch does) and, with
// find_unused_parameters, trace the outputs' graph. Calling module()->forward() directly also
// trains correctly (the gradient hooks are always armed), minus those services: its backward
// all-reduces unless a no_sync() guard is alive when its first gradient is ready.
//
// The wrapper is not a torch::nn::Module: its parameters, buffers and state dict use the
// module's own names, so snapshots of the wrapper and of the bare module are interchangeable.

#include <torch/torch.h>

#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "ddp/torch/ddp/comm_hooks.hpp"
#include "ddp/torch/ddp/join.hpp"
#include "ddp/torch/ddp/options.hpp"
#include "ddp/torch/ddp/reducer.hpp"
#include "ddp/torch/ddp/state.hpp"
#include "ddp/torch/ddp/timeline.hpp"

namespace ddp {

class DistributedDataParallelBase;
class DdpJoinHook;

// Gradient accumulation, as PyTorch's no_sync(): the backward of a forward run through the
// wrapper while the guard is alive only accumulates gradients locally (no communication),
// wherever that backward runs; the backward of a forward run outside it averages everything
// accumulated since the last synchronized backward, even when it runs under a guard. The
// decision is taken at forward time (Reducer::prepare_for_backward).
class NoSyncGuard {
 public:
  explicit NoSyncGuard(Reducer* reducer);
  ~NoSyncGuard();
  NoSyncGuard(NoSyncGuard&& other) noexcept;
  NoSyncGuard(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(const NoSyncGuard&) = delete;
  NoSyncGuard& operator=(NoSyncGuard&&) = delete;

 private:
  Reducer* reducer_;
  bool previous_ = true;
};

// Everything that does not depend on the module's type. Joinable (join.hpp): a rank that ran
// out of inputs inside a ddp::Join guard shadows the others' bucket all-reduces with zeros.
class DistributedDataParallelBase : public Joinable {
 public:
  DistributedDataParallelBase(std::shared_ptr<torch::nn::Module> module, ProcessGroupPtr pg,
                              DistributedDataParallelOptions options);
  virtual ~DistributedDataParallelBase();
  DistributedDataParallelBase(DistributedDataParallelBase&&) = default;
  DistributedDataParallelBase& operator=(DistributedDataParallelBase&&) = default;

  int rank() const { return pg_->rank(); }
  int world_size() const { return pg_->size(); }
  ProcessGroup& process_group() const { return *pg_; }
  const DistributedDataParallelOptions& options() const { return options_; }
  torch::nn::Module& base_module() const { return *base_; }

  [[nodiscard]] NoSyncGuard no_sync() { return NoSyncGuard(reducer_.get()); }

  // The module's tensors under the module's own names.
  std::vector<torch::Tensor> parameters() const { return base_->parameters(); }
  torch::OrderedDict<std::string, torch::Tensor> named_parameters() const;
  torch::OrderedDict<std::string, torch::Tensor> named_buffers() const;
  StateDict state_dict() const { return ddp::state_dict(*base_); }
  void load_state_dict(const StateDict& state, bool strict = true);

  void train(bool on = true) { base_->train(on); }
  void eval() { base_->eval(); }
  bool is_training() const { return base_->is_training(); }

  // Waits for any gradient averaging still pending (normally done when backward returns),
  // then runs optimizer.step(), recorded as "optimizer.step" in the timeline.
  template <typename Optimizer>
  void step(Optimizer& optimizer) {
    reducer_->finalize();
    Timeline::Scope span(timeline_.get(), "optimizer.step", Timeline::Track::kCompute);
    optimizer.step();
  }

  // Completes a pending gradient average; a no-op when backward already did.
  void finalize() { reducer_->finalize(); }

  // In-place recovery (recovery/step_manager.hpp): moves the wrapper onto `pg`, the re-formed
  // group of a new membership generation (its ranks may be renumbered after a lost node). The old
  // reducer is dropped with its iteration in flight and a new one builds its buckets on `pg`, as at
  // construction; SyncBatchNorm layers that took the old group take `pg`. Not collective:
  // nothing is broadcast.
  void reset_process_group(ProcessGroupPtr pg);

  // How many forwards searched their autograd graph for unused parameters
  // (find_unused_parameters: one per forward with grad mode; static_graph: none).
  int64_t unused_parameter_searches() const { return reducer_->unused_parameter_searches(); }

  // Parameter names per gradient bucket, in launch order.
  std::vector<std::vector<std::string>> bucket_names() const { return reducer_->bucket_names(); }

  // Joinable (ddp_join.cpp).
  std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) override;
  ProcessGroup& join_process_group() const override { return *pg_; }
  std::chrono::milliseconds join_timeout() const override { return timeout_; }

  // This rank's timeline, or null when options().timeline_path() is empty.
  Timeline* timeline() const { return timeline_.get(); }
  // The file the timeline goes to ("" when disabled).
  const std::string& timeline_file() const { return timeline_file_; }
  // Writes the timeline now (it is also written on destruction).
  void write_timeline() const;

 protected:
  // Around the module's forward: buffers broadcast, timeline span, unused-parameter trace.
  void before_forward();
  // True when `outputs` were replaced (static_graph's first iteration: see output_sink.hpp)
  // and the caller must return the replacements in their places.
  bool after_forward(std::vector<torch::Tensor>& outputs);
  Timeline::Clock::time_point forward_begin_;

 private:
  std::shared_ptr<torch::nn::Module> base_;
  ProcessGroupPtr pg_;
  DistributedDataParallelOptions options_;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<Timeline> timeline_;
  std::string timeline_file_;
  std::vector<torch::Tensor> buffers_;
  std::unique_ptr<Reducer> reducer_;
  std::unique_ptr<Reducer> make_reducer() const;
  void adopt_group_in_sync_batch_norms();

  // Join protocol (ddp_join.cpp). A rank still training, before its forward: the "not joined"
  // all-reduce, the buffers from the highest rank still training, the "will backward sync"
  // flag. A joined rank shadows those and the backward; at the end every rank takes the
  // parameters and buffers of the last rank to join.
  friend class DdpJoinHook;
  void join_before_forward();
  void join_shadow_iteration();
  void join_sync_final_model(bool is_last_joiner);
  // The rank every rank agrees on: the highest whose `candidate` is true.
  int join_common_rank(bool candidate);
  bool join_divide_by_initial_world_size_ = true;
};

namespace detail {

// The tensors in a forward's result, for tracing the graph (find_unused_parameters).
inline void collect_tensors(const torch::Tensor& t, std::vector<torch::Tensor>& out) {
  out.push_back(t);
}
inline void collect_tensors(const std::vector<torch::Tensor>& ts, std::vector<torch::Tensor>& out) {
  out.insert(out.end(), ts.begin(), ts.end());
}
template <typename... Ts>
void collect_tensors(const std::tuple<Ts...>& tuple, std::vector<torch::Tensor>& out) {
  std::apply([&](const auto&... items) { (collect_tensors(items, out), ...); }, tuple);
}
template <typename A, typename B>
void collect_tensors(const std::pair<A, B>& pair, std::vector<torch::Tensor>& out) {
  collect_tensors(pair.first, out);
  collect_tensors(pair.second, out);
}
// Anything else carries no tensors we can see: unused parameters are then found at the end of
// backward instead.
template <typename T>
void collect_tensors(const T&, std::vector<torch::Tensor>&) {}

// Puts `with` back into a forward's result, in collect_tensors' order (next: the position).
inline void replace_tensors(torch::Tensor& t, const std::vector<torch::Tensor>& with,
                            size_t& next) {
  t = with[next++];
}
inline void replace_tensors(std::vector<torch::Tensor>& ts, const std::vector<torch::Tensor>& with,
                            size_t& next) {
  for (auto& t : ts) t = with[next++];
}
template <typename... Ts>
void replace_tensors(std::tuple<Ts...>& tuple, const std::vector<torch::Tensor>& with,
                     size_t& next) {
  std::apply([&](auto&... items) { (replace_tensors(items, with, next), ...); }, tuple);
}
template <typename A, typename B>
void replace_tensors(std::pair<A, B>& pair, const std::vector<torch::Tensor>& with, size_t& next) {
  replace_tensors(pair.first, with, next);
  replace_tensors(pair.second, with, next);
}
template <typename T>
void replace_tensors(T&, const std::vector<torch::Tensor>&, size_t&) {}

}  // namespace detail

template <typename ModuleType>
class DistributedDataParallel : public DistributedDataParallelBase {
 public:
  DistributedDataParallel(std::shared_ptr<ModuleType> module, ProcessGroupPtr pg,
                          DistributedDataParallelOptions options = {})
      : DistributedDataParallelBase(module, std::move(pg), std::move(options)),
        module_(std::move(module)) {}

  DistributedDataParallel(const torch::nn::ModuleHolder<ModuleType>& holder, ProcessGroupPtr pg,
                          DistributedDataParallelOptions options = {})
      : DistributedDataParallel(holder.ptr(), std::move(pg), std::move(options)) {}

  const std::shared_ptr<ModuleType>& module() const { return module_; }

  // Calls module()->forward(args...) with DDP's per-iteration services around it.
  template <typename... Args>
  auto forward(Args&&... args) {
    before_forward();
    auto out = module_->forward(std::forward<Args>(args)...);
    std::vector<torch::Tensor> tensors;
    detail::collect_tensors(out, tensors);
    if (after_forward(tensors)) {
      size_t next = 0;
      detail::replace_tensors(out, tensors, next);
    }
    return out;
  }

  template <typename... Args>
  auto operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

 private:
  std::shared_ptr<ModuleType> module_;
};

template <typename M>
DistributedDataParallel(std::shared_ptr<M>, ProcessGroupPtr) -> DistributedDataParallel<M>;
template <typename M>
DistributedDataParallel(std::shared_ptr<M>, ProcessGroupPtr, DistributedDataParallelOptions)
    -> DistributedDataParallel<M>;
template <typename M>
DistributedDataParallel(const torch::nn::ModuleHolder<M>&, ProcessGroupPtr)
    -> DistributedDataParallel<M>;
template <typename M>
DistributedDataParallel(const torch::nn::ModuleHolder<M>&, ProcessGroupPtr,
                        DistributedDataParallelOptions) -> DistributedDataParallel<M>;

}  // namespace ddp
