#pragma once
// A stop every rank agrees on at the same step, with no collective of its own: a preemption
// notice (SLURM's --signal=USR1@N, the SIGTERM of scancel or preemption) that reaches one rank
// stops every rank after the same step, so they all checkpoint that step and exit with
// kRequeueExitStatus (util/exit_status.hpp), which deploy/slurm-*.sbatch turn into a requeue.
//
//   auto stop = std::make_shared<ddp::StopRequest>(
//       ddp::StopRequestOptions().signals({SIGUSR1, SIGTERM}));
//   ddp::DistributedDataParallel model(net, pg,
//                                      ddp::DistributedDataParallelOptions().stop_request(stop));
//   for (...) {
//     loss.backward();  model.step(opt);  ++progress.step;
//     if (stop->agreed()) {              // true on every rank after the same step
//       ckpt.save(progress, *net, &opt);  ckpt.wait();  pg->barrier()->wait(pg->timeout());
//       return ddp::kRequeueExitStatus;
//     }
//   }
//
// Protocol: DDP's gradient all-reduce carries one more element, at the end of the bucket
// launched last in every synchronized backward (BucketInfo names it kStopRequestMember, shape
// {1}): 1 on a rank that requested a stop before that bucket was launched, 0 on the others.
// The bucket's comm hook reduces it with the gradients, so after the backward every rank holds
// the same value, non-zero when some rank asked: agreed() then turns true on every rank at the
// same step, and stays true. A request is sticky, so a rank that misses one step's result still
// agrees at a later one, with the others.
// Contract for comm hooks (comm_hooks.hpp): reduce every member of the bucket, as a sum or an
// average; the built-in hooks do (allreduce, fp16/bf16 compression, PowerSGD, which sends a
// 1-element member uncompressed). A hook that skips communication in some iterations cannot
// carry the flag: call agree(pg) after the step instead (one small collective).
// Gradient accumulation (no_sync): the flag travels with the next synchronized backward.
// Join: a rank that has joined contributes 0.
//
// Signals: with StopRequestOptions::signals, the object installs handlers that only record the
// signal (async-signal-safe); requested() is then true on this rank. The handlers are the
// process's (signals are process-wide) and the previous ones are restored on destruction.
// A listened SIGTERM no longer ends the process: the trainer must reach a step boundary within
// the launcher's grace period (ddprun --shutdown-timeout, SLURM's KillWait), else SIGKILL.

#include <ATen/core/Tensor.h>
#include <signal.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include <torch/arg.h>

#include "ddp/comm/process_group.hpp"
#include "ddp/util/exit_status.hpp"

namespace ddp {

struct StopRequestOptions {
  // Signals whose arrival requests the stop (e.g. {SIGUSR1, SIGTERM}); none by default.
  TORCH_ARG(std::vector<int>, signals) = {};
};

class StopRequest {
 public:
  // The name of the flag's member in the bucket that carries it (BucketInfo::names).
  static constexpr const char* kStopRequestMember = "ddp.stop_request";

  // Throws UsageError for a signal that cannot be caught (SIGKILL, SIGSTOP) or is out of
  // range.
  explicit StopRequest(StopRequestOptions options = {});
  ~StopRequest();
  StopRequest(const StopRequest&) = delete;
  StopRequest& operator=(const StopRequest&) = delete;

  // This rank asks every rank to stop. Thread-safe and async-signal-safe (an atomic store).
  void request() noexcept;
  // This rank asked (request(), or a listened signal arrived).
  bool requested() const noexcept;
  // The first listened signal (in options order) that arrived since construction, 0 when none.
  int signal() const noexcept;

  // True once a collective that carries the flag showed that some rank asked; then the same on
  // every rank, from the same step on. On CUDA the first call after a step reads one number
  // from the device (it waits for that step's all-reduce).
  bool agreed();
  // The synchronized backward (1 = the first; agree(): the call) whose result agreed; 0 while
  // not agreed.
  int64_t agreed_iteration();

  // Without DDP (or with a comm hook that cannot carry the flag): one all-reduce of this
  // rank's flag over `pg`, collective; returns agreed(). Bounded by pg's timeout.
  bool agree(ProcessGroup& pg);

  // For the collective that carries the flag (the DDP Reducer): the value this rank sends,
  // and the reduced value (a 1-element tensor, read lazily by agreed()).
  double outgoing() const noexcept { return requested() ? 1.0 : 0.0; }
  void incoming(at::Tensor reduced, int64_t iteration);

 private:
  std::vector<int> signals_;
  std::vector<struct sigaction> saved_;  // the handlers to restore
  std::vector<uint32_t> baseline_;       // per signal: arrivals before construction
  std::atomic<bool> requested_{false};
  std::mutex mutex_;
  at::Tensor pending_;  // the latest reduced flag, unread
  int64_t pending_iteration_ = 0;
  bool agreed_ = false;
  int64_t agreed_iteration_ = 0;
};

using StopRequestPtr = std::shared_ptr<StopRequest>;

}  // namespace ddp
