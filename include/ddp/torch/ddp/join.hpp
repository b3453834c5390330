#pragma once
// Join: training on uneven inputs, like torch.distributed.algorithms.Join.
//
//   ddp::DistributedDataParallel model(net, pg);
//   ddp::ZeroRedundancyOptimizer<torch::optim::Adam> opt(model.parameters(), {1e-3}, pg);
//   {
//     ddp::Join joined({&model, &opt});
//     for (auto& batch : my_batches) {   // ranks may hold different numbers of batches
//       opt.zero_grad();
//       model(batch.data).sum().backward();
//       opt.step();
//     }
//   }  // a rank that ran out of batches waits here, shadowing the others' collectives
//
// Protocol (the same collectives in the same order as PyTorch's, so the arithmetic matches):
// - Every iteration of a rank still training begins with a "not joined" all-reduce of 1
//   issued by the first Joinable of the guard (DistributedDataParallel's forward, or ZeRO's
//   step when it comes first): Join::notify_join_context. Its sum is the number of ranks
//   still training.
// - A rank whose loop ended reaches the guard's end (the destructor, or finish()) and loops:
//   all-reduce 0 (matching the others' "not joined" 1); while the sum is not 0, it runs each
//   Joinable's JoinHook::main_hook, which issues the collectives the training ranks issue in
//   one iteration (DDP: the bucket all-reduces with zero gradients; ZeRO: its step and the
//   parameter all-gather). When the sum is 0 every rank has joined, and each runs its hooks'
//   post_hook (DDP: every rank takes the parameters of the last rank to join).
// - throw_on_early_termination: instead of shadowing, the first rank to join makes every rank
//   throw: the training ranks a CollectiveError from their next iteration, the joined rank
//   one from the guard's end.
//
// Contract: every Joinable of a guard uses the same process group; every rank builds its guard
// with the same Joinables in the same order and the same options; that order is the order of
// their collectives within one iteration (the model before its optimizer, as in PyTorch: a
// joined rank runs the hooks in this order, and the first Joinable counts the ranks). The
// guard's end is collective and blocks until every rank has joined (each collective bounded by
// the Joinables' timeout: DDP's, else the group's).
// When the scope is left by an exception the guard does nothing (as PyTorch's __exit__), so the
// exception propagates; the ranks still training then fail by timeout unless they throw too.

#include <chrono>
#include <memory>
#include <vector>

#include <torch/arg.h>

#include "ddp/comm/process_group.hpp"

namespace ddp {

struct JoinOptions {
  // false: the guard does nothing (for code that knows its inputs are even).
  TORCH_ARG(bool, enable) = true;
  // Throw on every rank as soon as one rank runs out of inputs, instead of shadowing.
  TORCH_ARG(bool, throw_on_early_termination) = false;
  // DDP: while some ranks have joined, average gradients over the initial world size (true:
  // the joined ranks count as zero gradients) or over the ranks still training (false).
  TORCH_ARG(bool, divide_by_initial_world_size) = true;
};

// What a Joinable does for a rank that has joined.
class JoinHook {
 public:
  virtual ~JoinHook() = default;
  // Called once per iteration of the ranks still training: issues the collectives they issue.
  virtual void main_hook() {}
  // Called once every rank has joined; is_last_joiner: this rank ran no main_hook (it was
  // among the last to run out of inputs).
  virtual void post_hook(bool /*is_last_joiner*/) {}
};

// How a Join guard configured a Joinable (disabled outside a guard).
struct JoinConfig {
  bool enable = false;
  bool throw_on_early_termination = false;
  bool is_first_joinable = false;
};

// Something whose per-iteration collectives a joined rank can shadow.
class Joinable {
 public:
  virtual ~Joinable() = default;
  // The hook a joined rank runs; `options` are the guard's (the same on every Joinable).
  virtual std::unique_ptr<JoinHook> join_hook(const JoinOptions& options) = 0;
  // The group of the Joinable's collectives; the guard's own all-reduces use it too.
  virtual ProcessGroup& join_process_group() const = 0;
  // Bound on each of the guard's waits (the Joinable's own timeout).
  virtual std::chrono::milliseconds join_timeout() const { return join_process_group().timeout(); }

  const JoinConfig& join_config() const { return join_config_; }

 private:
  friend class Join;
  JoinConfig join_config_;
};

class Join {
 public:
  // joinables: not null, at least one, same process group; their hooks run in this order.
  // Throws UsageError otherwise.
  explicit Join(std::vector<Joinable*> joinables, JoinOptions options = {});
  // Runs finish() unless it ran already or an exception is unwinding the scope. May throw
  // (throw_on_early_termination, timeouts): declared noexcept(false).
  ~Join() noexcept(false);
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  // This rank has run out of inputs: shadow the others until every rank has joined, then run
  // the post hooks. Collective. Throws CollectiveError with throw_on_early_termination when
  // some rank was still training.
  void finish();

  // Called by a Joinable before its per-iteration collectives on a rank still training. Only
  // the guard's first Joinable communicates: it all-reduces "not joined" and returns how many
  // ranks are still training (this one included); with throw_on_early_termination it also
  // learns whether some rank has joined and then throws CollectiveError. Returns 0 without
  // communicating for the other Joinables and outside a guard.
  static int notify_join_context(Joinable& joinable);

 private:
  // Sum over ranks of `value`, bounded by the first Joinable's timeout.
  int all_reduce_count(int value);

  std::vector<Joinable*> joinables_;
  std::vector<std::unique_ptr<JoinHook>> hooks_;
  JoinOptions options_;
  ProcessGroup* pg_ = nullptr;
  int uncaught_at_entry_ = 0;
  bool finished_ = false;
};

}  // namespace ddp
