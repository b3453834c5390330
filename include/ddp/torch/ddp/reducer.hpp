#pragma once
// Reducer: averages gradients over the ranks of a ProcessGroup while backward runs.
//
// A post-hook on each parameter's AccumulateGrad node fires once the gradient of this backward
// has been accumulated into param.grad(). The hook copies it into its bucket's flat buffer (or
// finds it already there, with gradient_as_bucket_view) and, when the bucket is full, launches
// the bucket's communication hook at once, asynchronously, while autograd goes on. Buckets are
// launched strictly in index order, so all ranks issue the same collectives in the same order
// even when gradients arrive in different orders.
//
// The first hook of a backward queues a final autograd callback; it runs when backward ends,
// waits for every bucket and writes the averages back into param.grad(). When backward returns,
// the gradients therefore hold the average over ranks. finalize() does the same for callers
// whose backward ran outside the autograd engine's callback machinery (normally a no-op).
//
// Buckets start in reverse registration order and are rebuilt once, after the first
// synchronized backward, in the order its gradients became ready on rank 0 (like PyTorch).
//
// Unused parameters (no gradient in this backward): with find_unused_parameters they are
// marked ready with their current gradient (zeros when none), found either from the graph of
// the forward outputs (mark_unused_from_outputs) or, failing that, at the end of backward.
// A parameter that no rank used keeps its gradient untouched (undefined stays undefined), as
// in single-process training. Without find_unused_parameters a missing gradient is a
// UsageError naming the parameters.
//
// Whether a backward is synchronized at all is decided by the forward that built its graph
// (prepare_for_backward, the no_sync state at forward time); a backward that is not only marks
// which parameters it used.
//
// static_graph (static_graph.hpp): the first synchronized backward counts each parameter's
// hook firings and reduces everything when it ends; later ones mark a parameter ready at its
// last expected firing and queue the final callback when the last bucket is launched.
//
// Thread-safety: hooks may run on autograd worker threads; all state is under one mutex.

#include <torch/torch.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ddp/comm/process_group.hpp"
#include "ddp/torch/ddp/bucketing.hpp"
#include "ddp/torch/ddp/comm_hooks.hpp"
#include "ddp/torch/ddp/straggler.hpp"
#include "ddp/torch/ddp/timeline.hpp"

namespace ddp {

class StaticGraph;
class StopRequest;

struct ReducerConfig {
  size_t first_bucket_cap_bytes = 1 << 20;
  size_t bucket_cap_bytes = 25 << 20;
  bool find_unused_parameters = false;
  bool gradient_as_bucket_view = false;
  bool static_graph = false;  // see DistributedDataParallelOptions::static_graph
  CommHookPtr comm_hook;      // null: allreduce_hook()
  // Carried as one more element of the last bucket (stop_request.hpp); null: none.
  std::shared_ptr<StopRequest> stop_request;
  std::chrono::milliseconds timeout{ProcessGroup::kDefaultTimeout};
  std::shared_ptr<Timeline> timeline;  // null: no spans recorded
  // Synchronized iterations per straggler check (straggler.hpp); 0: off.
  int64_t straggler_window = StragglerMonitor::window_from_env();
};

class Reducer {
 public:
  // params: the parameters to average (all require grad), names for messages.
  Reducer(std::vector<torch::Tensor> params, std::vector<std::string> names, ProcessGroupPtr pg,
          ReducerConfig config);
  ~Reducer();
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // The no_sync state (DistributedDataParallel::no_sync sets it false while its guard lives).
  void set_sync(bool sync);
  bool sync() const;

  // Called after every forward through the wrapper with grad mode on (PyTorch's
  // prepare_for_backward): records the no_sync state of this moment as the decision for the
  // next backward, so a forward under no_sync() is not all-reduced even when its backward
  // runs after the guard ended, and a forward outside the guard is all-reduced even when its
  // backward runs under one. The decision is consumed by that backward; a backward with no
  // recorded decision (the module's forward called directly) follows set_sync's state at
  // the moment its first gradient is ready. With find_unused_parameters and a synchronized
  // decision it also records which parameters the graph of `outputs` cannot reach, so they
  // are marked ready as soon as backward starts.
  // Returns replacements for `outputs` when the wrapper must hand those to the caller instead
  // (static_graph's first synchronized iteration: the outputs pass through a sink whose
  // backward starts the Reducer's backward in the outermost graph task, see output_sink.hpp);
  // empty otherwise.
  [[nodiscard]] std::vector<torch::Tensor> prepare_for_backward(
      const std::vector<torch::Tensor>& outputs);

  // Completes a backward whose final callback has not run yet; no-op when none is pending.
  void finalize();

  // How many times the autograd graph of a forward's outputs was searched for unused
  // parameters (find_unused_parameters; never with static_graph).
  int64_t unused_parameter_searches() const;

  // Join (join.hpp, reducer_join.cpp). The averages of later backwards are multiplied by
  // `scale` (1 by default): under Join with divide_by_initial_world_size off, world size over
  // the number of ranks still training, so the average is over those ranks only. Not with a
  // comm hook passed in ReducerConfig: its output is used as it is, as in PyTorch.
  void set_gradient_scale(double scale);
  // On a rank that has joined: issues the collectives of one synchronized backward of the
  // ranks still training, with zero gradients (every bucket's hook on a zero buffer, the
  // used-parameter all-reduce, the one-time bucket rebuild), and waits for them. This rank's
  // gradients are left as they are, as PyTorch leaves them.
  void shadow_backward_for_join();

  // Bucket contents as parameter names, in launch order (diagnostics, tests).
  std::vector<std::vector<std::string>> bucket_names() const;

 private:
  struct Bucket {
    std::vector<size_t> params;        // indices into params_
    torch::Tensor buffer;              // flat, one dtype/device
    std::vector<torch::Tensor> views;  // per member, shaped like the parameter
    size_t pending = 0;                // members not yet ready in this backward
    BucketInfo info;                   // layout for the comm hook (iteration set at launch)
    std::unique_ptr<BucketReduction> reduction;
    Timeline::Clock::time_point launched_at;
    bool completion_recorded = false;
  };

  void build_buckets(const std::vector<std::vector<size_t>>& assignment);
  void rebuild_buckets_locked();
  void mark_unused_from_outputs(const std::vector<torch::Tensor>& outputs);
  // A backward reached the outputs' sink (before any gradient hook of that backward).
  void on_outputs_backward();
  void on_gradient_ready(size_t index);
  // The first gradient of a backward: decides (recorded decision, else sync_) whether this
  // backward is synchronized; false when it only accumulates locally.
  bool start_backward_locked();
  void begin_backward_locked();
  void mark_ready_locked(size_t index);
  void launch_ready_buckets_locked();
  void poll_completions_locked();
  void finalize_locked();
  void end_straggler_iteration_locked();  // straggler.hpp's exchange point
  void reset_iteration_locked();
  // Rank 0, once: a warning when find_unused_parameters found every parameter used
  // (`global_used`: per parameter, how many ranks produced its gradient).
  void warn_if_unused_option_is_unneeded(const int32_t* global_used) const;
  void abandon_iteration_locked();
  // Rethrows the exception in flight; a TimeoutError gains `what` timed out ("bucket 0's
  // all-reduce"), the iteration and the usual cause in training loops (ranks running different
  // numbers of iterations).
  [[noreturn]] void rethrow_with_iteration_context(const std::string& what) const;

  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  ProcessGroupPtr pg_;
  ReducerConfig config_;

  // Each parameter's AccumulateGrad node, in LibTorch's own smart pointer (std::shared_ptr up
  // to 2.x, c10::intrusive_ptr in 2.13): Edge::function names whichever this LibTorch uses.
  std::vector<decltype(torch::autograd::Edge::function)> accumulators_;
  std::vector<uintptr_t> hook_keys_;
  std::vector<BucketParam> sizes_;  // per parameter, for assign_buckets
  std::vector<Bucket> buckets_;
  std::vector<std::pair<size_t, size_t>> locator_;  // param -> (bucket, slot)

  mutable std::mutex mutex_;
  bool sync_ = true;
  std::optional<bool> forward_sync_;  // recorded by prepare_for_backward, consumed by backward
  bool in_backward_ = false;          // a synchronized backward is running
  bool in_local_backward_ = false;    // a backward that only accumulates locally is running
  size_t next_bucket_ = 0;
  std::vector<bool> ready_;
  std::vector<int32_t> locally_used_;  // since the last synchronized backward
  std::vector<size_t> known_unused_;   // from mark_unused_from_outputs
  bool buckets_rebuilt_ = false;
  // find_unused_parameters: whether the first synchronized iteration's use was checked (rank 0
  // warns when every parameter was used: the option then only costs time).
  bool unused_option_checked_ = false;
  int64_t iteration_ = 0;  // synchronized backwards begun so far (the current one's number)
  std::vector<size_t> ready_order_;  // gradients in ready order, until the rebuild
  Timeline::Clock::time_point backward_begin_;
  int64_t unused_parameter_searches_ = 0;
  // static_graph: hook counts of the first synchronized backward; null without the option.
  std::unique_ptr<StaticGraph> static_graph_;
  std::vector<int32_t> static_global_used_;  // static_graph: per parameter, ranks using it
  bool finalize_queued_ = false;             // this backward's final callback is queued
  std::shared_ptr<char> alive_ = std::make_shared<char>();  // sinks outliving us see it gone

  double gradient_scale_ = 1.0;  // set_gradient_scale
  // A hook was passed in ReducerConfig (else allreduce_hook() is the default): the Join
  // gradient scale then does not apply, as PyTorch applies divide_by_initial_world_size=false
  // only to its built-in all-reduce (a registered hook's output is used as it is).
  bool has_user_comm_hook_ = false;
  StragglerMonitor stragglers_;  // this rank's waits for its peers in the bucket all-reduces
};

}  // namespace ddp
