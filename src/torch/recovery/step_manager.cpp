#include "ddp/torch/recovery/step_manager.hpp"

#include <fmt/format.h>

#include <thread>

#include "ddp/store/recovery_notice.hpp"
#include "ddp/torch/nn/random_state.hpp"
#include "ddp/torch/optim/zero_redundancy_optimizer.hpp"
#include "ddp/torch/recovery/peer_heal.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"

namespace ddp {

namespace {

// A replacement under --recovery shrink claims its slot back in attach(), once its model and
// data are built (RecoverableGroupOptions::defer_return).
RecoverableGroupOptions deferring_return(RecoverableGroupOptions options) {
  options.defer_return = true;
  return options;
}

std::chrono::milliseconds notice_wait_from_env() {
  const std::optional<int64_t> ms = env::get_int(recovery_notice::kNoticeWaitEnvVar);
  return std::chrono::milliseconds(ms && *ms > 0 ? *ms : 5000);
}

}  // namespace

StepManager::StepManager(StepManagerOptions options)
    : options_(std::move(options)),
      notice_wait_(options_.notice_wait.value_or(notice_wait_from_env())),
      group_(deferring_return(options_.group)) {
  if (options_.max_attempts_per_step < 1) {
    throw UsageError(
        fmt::format("StepManagerOptions::max_attempts_per_step must be at least 1, "
                    "got {}",
                    options_.max_attempts_per_step));
  }
}

StepManager::~StepManager() = default;

void StepManager::attach(DistributedDataParallelBase& model, torch::optim::Optimizer& optimizer) {
  if (model_ != nullptr) throw UsageError("StepManager::attach: already attached");
  if (&model.process_group() != group_.group().get()) {
    throw UsageError(
        "StepManager::attach: the DDP wrapper runs on another process group; build it on "
        "StepManager::process_group() (with DistributedDataParallelOptions().init_sync(false))");
  }
  auto* zero = dynamic_cast<ZeroRedundancyOptimizerBase*>(&optimizer);
  if (zero != nullptr) {
    if (&zero->join_process_group() != group_.group().get()) {
      throw UsageError(
          "StepManager::attach: the ZeroRedundancyOptimizer runs on another process group; "
          "build it on StepManager::process_group()");
    }
    zero->enable_recovery();  // replicas, the backward check (zero_redundancy_optimizer.hpp)
  }
  model_ = &model;
  optimizer_ = &optimizer;
  zero_ = zero;
  // ddprun restarts a lost rank alone only for a job whose loop a StepManager drives (nothing
  // else would redo the survivors' step); otherwise the whole group.
  if (group_.store()) recovery_notice::announce_step_manager(*group_.store());
  cuda_device_ = cuda_device_of(model.base_module());
  if (group_.returning()) {
    // The others trained on while this replacement started: it joins them now, ready.
    group_.claim_return();
    model_->reset_process_group(group_.group());
  }
  // This process starts with no trained state: at the job's start (every rank fresh) rank 0's
  // state goes everywhere, after a restart the survivors' does.
  HealTarget target{&model.base_module(), &optimizer, &step_, {}};
  for (;;) {
    try {
      heal_from_peer(group_.group(), target, /*fresh=*/true, group_.group()->timeout());
      return;
    } catch (const std::exception& e) {
      if (!loss_announced(e)) throw;
    }
    // Another rank was lost while this one joined (RemovedFromJobError propagates).
    group_.reform();
    model_->reset_process_group(group_.group());
  }
}

bool StepManager::loss_announced(const std::exception& error) const {
  if (group_.stale()) return true;
  const bool peer_related = dynamic_cast<const NetworkError*>(&error) != nullptr ||
                            dynamic_cast<const CollectiveError*>(&error) != nullptr;
  if (!peer_related) return false;
  const auto until = std::chrono::steady_clock::now() + notice_wait_;
  while (std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (group_.stale()) return true;
  }
  return false;
}

void StepManager::recover() {
  for (int tries = 0;; ++tries) {
    try {
      group_.reform();
      ++recoveries_;
      model_->reset_process_group(group_.group());
      HealTarget target{&model_->base_module(), optimizer_, &step_, {}};
      if (pending_rng_) {
        // The ZeRO step cut by the loss is dropped, not rolled forward: what run_step held back.
        target.drop_pending = [this] {
          ++dropped_;
          optimizer_->zero_grad();
          restore_random_state(cuda_device_, *pending_rng_);
        };
      }
      const HealResult healed =
          heal_from_peer(group_.group(), target, /*fresh=*/false, group_.group()->timeout());
      pending_rng_.reset();
      log::get("ddp.recovery")
          ->info("rank {}: group re-formed at generation {} ({}): rank {} of {}; {} at step {}",
                 group_.slot(), generation(), group_.loss_description(), rank(), world_size(),
                 healed.transferred ? fmt::format("state from rank {}", healed.source)
                                    : std::string("no state sent"),
                 step_);
      return;
    } catch (const RemovedFromJobError&) {
      throw;  // no generation has a place for this rank: nothing to retry
    } catch (const std::exception& e) {
      if (!loss_announced(e) || tries + 1 >= options_.max_attempts_per_step) throw;
    }
  }
}

torch::Tensor StepManager::run_step(const std::function<torch::Tensor()>& fn) {
  if (model_ == nullptr) {
    throw UsageError("StepManager::run_step: call attach(model, optimizer) first");
  }
  const int64_t step_at_call = step_;
  torch::Tensor cut_out;  // fn's result of an attempt cut inside ZeRO's optimizer step
  for (int attempt = 1;; ++attempt) {
    if (group_.stale()) {  // one atomic load when nothing changed
      recover();
      // The cut ZeRO step was rolled forward by the heal: this call's step is committed.
      if (cut_out.defined() && step_ > step_at_call) return cut_out;
      cut_out = torch::Tensor();
    }
    const RandomState rng_at_start = capture_random_state(cuda_device_);
    optimizer_->zero_grad();
    torch::Tensor out;
    try {
      out = fn();
      model_->finalize();
      // Every gradient holds the average over all ranks now: commit, even when a loss was
      // announced meanwhile (a peer that dropped this step heals from this rank's state).
      optimizer_->step();
      ++step_;
      return out;
    } catch (const std::exception& e) {
      // A loss shows as PeerLostError, as a socket error (gloo), or as whatever an autograd
      // hook made of it: ddprun's notice, seen by the watcher, is what decides.
      if (!loss_announced(e) || attempt >= options_.max_attempts_per_step) throw;
      if (zero_ != nullptr && zero_->pending() != ZeroRedundancyOptimizerBase::Pending::kNone) {
        // Cut inside ZeRO's step after the backward: the heal rolls it forward (with these
        // gradients and this generator state) or drops it (peer_heal.hpp).
        pending_rng_ = rng_at_start;
        cut_out = out;
        log::get("ddp.recovery")
            ->warn(
                "rank {}: step {} cut in the optimizer step (a member was lost: {}); "
                "re-forming, then finishing or redoing it",
                rank(), step_, e.what());
        continue;
      }
      ++dropped_;
      log::get("ddp.recovery")
          ->warn("rank {}: step {} dropped (a member was lost: {}); re-forming and redoing it",
                 rank(), step_, e.what());
      optimizer_->zero_grad();
      restore_random_state(cuda_device_, rng_at_start);
    }
  }
}

}  // namespace ddp
