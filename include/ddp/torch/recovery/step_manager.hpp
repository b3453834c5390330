#pragma once
// StepManager: a failure costs one step, not a restart (in-place recovery, docs/recovery.md).
//
//   ddp::StepManager steps;                          // joins the current generation
//   ddp::DistributedDataParallel model(net, steps.process_group(),
//                                      ddp::DistributedDataParallelOptions().init_sync(false));
//   torch::optim::Adam opt(model.parameters(), 1e-3);
//   steps.attach(model, opt);                        // every rank gets a healthy peer's state
//   while (steps.step() < total) {
//     auto batch = batch_for_step(steps.step());     // the data position follows the step
//     steps.run_step([&] { auto loss = loss_fn(model(batch.x), batch.y); loss.backward();
//                          return loss; });
//   }
//
// Run under `ddprun --recovery step`: when a rank dies, ddprun restarts it in place and
// announces the loss in the job's store; the survivors' collective in flight fails with
// PeerLostError within milliseconds of that record (RecoverableGroup's watcher waits for it).
//
// Contract of run_step(fn):
// - fn runs forward and backward through the DDP wrapper (gradients are zeroed before it);
//   run_step then runs optimizer.step() and counts the step. The step is committed on this rank
//   when run_step returns.
// - Membership is checked at the start of every step with one atomic load (no store round trip)
//   when nothing changed.
// - A member lost during the step: no optimizer step on partial gradients. The survivors drop
//   the attempt (gradients zeroed, the random state rewound to the step's start: the CPU
//   generator's and the module's CUDA device's, random_state.hpp), re-form the
//   group in the same processes, rebuild DDP's reducer on it, bring every rank (the restarted
//   one included) to the state of the most advanced healthy rank (peer_heal.hpp), and run fn
//   again for the same step. Gradients are averaged over the ranks that took part, which with
//   in-place restarts is the full world again, and after a lost node the survivors only.
// - A node lost in a multi-node job (its agent missed its heartbeats): ddprun takes its ranks
//   out of the job and the survivors go on with fewer ranks (rank() and world_size() change at
//   the re-form; DDP's reducer is rebuilt on the smaller group). Learning-rate scaling is the
//   program's. A process whose node was declared lost while it still ran gets
//   RemovedFromJobError.
// - fn must be a function of step() (the batch, any schedule) and must not act on the outside
//   world before run_step returns (log after it: a dropped attempt is invisible).
// - Other errors propagate unchanged; so does a loss when this rank has no StepManager state
//   attached yet.
//
// - A ZeroRedundancyOptimizer (built on process_group()) keeps working: attach() makes it keep
//   a replica of another rank's shard, a re-form reshards it over the new group, and a step
//   cut inside its optimizer step is finished on every survivor when any had applied it
//   (peer_heal.hpp); otherwise dropped like any other.
//
// Backends: cpu on one host (its waits poll the abort) and gloo (a dead peer's socket closes,
// which ends the collective in flight; the notice then confirms the loss).
// Not yet (docs/recovery.md): multi-host cpu groups whose peer hangs rather than dies.

#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "ddp/comm/recoverable_group.hpp"
#include "ddp/torch/ddp/distributed_data_parallel.hpp"
#include "ddp/torch/nn/random_state.hpp"

namespace ddp {

struct StepManagerOptions {
  RecoverableGroupOptions group;
  // A step redone this many times in a row (a loss during every attempt) gives up with the last
  // PeerLostError.
  int max_attempts_per_step = 16;
  // A collective that fails with NetworkError or CollectiveError before ddprun's notice arrived
  // (gloo sees a dead peer's socket close first) waits up to this long for the notice; with it
  // the step is redone, without it the error propagates after the wait. Unset: ddprun's
  // DDP_RECOVERY_NOTICE_WAIT_MS (on several nodes: long enough for a lost node's missed
  // heartbeats), else 5 s.
  std::optional<std::chrono::milliseconds> notice_wait;
};

class ZeroRedundancyOptimizerBase;

class StepManager {
 public:
  explicit StepManager(StepManagerOptions options = {});
  ~StepManager();
  StepManager(const StepManager&) = delete;
  StepManager& operator=(const StepManager&) = delete;

  // The current generation's group: build DDP on it (init_sync(false)). Under --recovery shrink
  // a replacement's is a group of its own until attach() (RecoverableGroupOptions::
  // defer_return: the others train on meanwhile): run no collective of the program's before.
  const ProcessGroupPtr& process_group() const { return group_.group(); }
  // This rank and the world size in the current generation: both shrink when a node is lost
  // (the survivors are renumbered in slot order), so read them per step, e.g. for the step's
  // share of the data.
  int rank() const { return group_.rank(); }
  int world_size() const { return group_.world_size(); }
  // The rank this process was launched with (RANK); it never changes (files named per rank).
  int slot() const { return group_.slot(); }
  // The world size the job was launched with; fixed, unlike world_size() (e.g. the data's
  // shares: examples/mnist/step_recovery.hpp).
  int launch_world_size() const { return group_.launch_world_size(); }
  int64_t generation() const { return group_.generation(); }

  // Registers the training state and heals it (collective): afterwards every rank holds the
  // parameters, buffers, optimizer state, step counter and generator state of a healthy peer
  // (rank 0 at the job's start). Call once, after building DDP on process_group().
  void attach(DistributedDataParallelBase& model, torch::optim::Optimizer& optimizer);

  // Steps committed (restored from the peer when this rank (re)joined).
  int64_t step() const { return step_; }
  // Attempts dropped on this rank because a member was lost.
  int64_t steps_dropped() const { return dropped_; }
  // Re-forms this rank took part in.
  int64_t recoveries() const { return recoveries_; }

  // Runs one step; see the contract above. Returns fn's result of the committed attempt.
  torch::Tensor run_step(const std::function<torch::Tensor()>& fn);

 private:
  // Re-forms the group, moves DDP onto it and heals; repeats while further losses strike.
  void recover();
  // Whether the error in flight is a member's loss: announced already, or (for errors a lost
  // peer can cause) announced within options_.notice_wait.
  bool loss_announced(const std::exception& error) const;

  StepManagerOptions options_;
  std::chrono::milliseconds notice_wait_;
  RecoverableGroup group_;
  DistributedDataParallelBase* model_ = nullptr;
  torch::optim::Optimizer* optimizer_ = nullptr;
  ZeroRedundancyOptimizerBase* zero_ = nullptr;  // optimizer_, when it is one
  // The generators at the start of a ZeRO step cut after its backward: the heal decides
  // whether it is dropped (then they are restored) or rolled forward.
  std::optional<RandomState> pending_rng_;
  std::optional<c10::Device> cuda_device_;  // the model's, found at attach (random_state.hpp)
  int64_t step_ = 0;
  int64_t dropped_ = 0;
  int64_t recoveries_ = 0;
};

}  // namespace ddp
