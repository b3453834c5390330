#pragma once
// One attempt: start every local worker, forward their output, watch them, stop them.
//
// run() returns only when every worker and every descendant the launcher adopted (it is a
// child subreaper) has been reaped and every pipe drained, whatever happened:
// - all workers exit 0                  -> kSucceeded (leftover descendants are stopped)
// - a worker exits non-zero or by signal -> kFailed: ddprun notes every worker's process state
//   (running, stopped, in uninterruptible sleep, exited) and asks the live ones that handle it
//   to write their flight record (flight_recorder_dump_signal(), up to 2 s); then the others get
//   SIGTERM and SIGCONT (to their process groups), SIGKILL after the grace period. A worker
//   that died by SIGKILL is explained (kill_cause.hpp: the out-of-memory killer or not)
// - SIGINT/SIGTERM/SIGHUP/SIGQUIT arrive  -> forwarded to every worker group, then the same
//   stop -> kInterrupted; a second such signal kills at once
// - SIGUSR1/SIGUSR2 arrive                -> forwarded; monitoring goes on
// - a worker exits with kRequeueExitStatus (util/exit_status.hpp: stopped on request after a
//   checkpoint) -> not a failure: the others are awaited; when every worker exited 0 or with
//   it (and some with it) -> kRequeue; after a terminating signal, when every worker exited
//   with it -> kRequeue (signal set) instead of kInterrupted
// - --hang-timeout: no collective completed while one waited, for that long -> the same as a
//   failure, with the rank in no collective (else the lowest waiting one) as the root cause
// - stop_fd turns readable (membership change in a multi-node run) -> the same stop ->
//   kStopped, unless a worker had already failed (kFailed)
// - --recovery step (replace_failed set): the first worker that fails is offered to
//   replace_failed first; when it answers a restart count (only while the others run), only
//   that worker is started again (same rank, its logs appended) and the attempt goes on;
//   otherwise as above

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launcher/hang_report.hpp"
#include "ddp/launcher/root_cause.hpp"
#include "ddp/launcher/signals.hpp"
#include "ddp/launcher/stack_capture.hpp"
#include "ddp/launcher/std_streams.hpp"
#include "ddp/launcher/worker_placement.hpp"
#include "ddp/launcher/world.hpp"

namespace ddp::launcher {

class RunDirectory;
class StackService;

struct AttemptSpec {
  const WorldAssignment* world = nullptr;
  const RunDirectory* run_dir = nullptr;
  // TORCHELASTIC_RESTART_COUNT: restarts of this agent's worker group after a failure.
  int restart_count = 0;
  // Names the attempt's log folder (attempt_<n>): the restart count on one node, the
  // rendezvous generation on several (a membership change starts a new folder too).
  int attempt = 0;
  int max_restarts = 0;
  std::string role;
  std::string run_id;
  std::string host;
  std::vector<std::string> command;   // resolved argv
  std::vector<std::string> base_env;  // "KEY=VALUE"
  bool set_omp_threads = false;
  bool write_logs = false;  // write stdout.log/stderr.log for every rank (--log-dir)
  StdSpec redirects;
  StdSpec tee;
  std::optional<std::vector<int>> local_ranks_filter;
  // --numa-binding and --virtual-local-rank; the CPUs of each local rank that --numa-binding
  // chose (empty: no binding), computed once before anything starts.
  WorkerPlacement placement;
  std::vector<std::vector<int>> worker_cpus;
  // --duplicate-stdout-filters / --duplicate-stderr-filters (launch_options.hpp).
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  std::chrono::milliseconds term_grace{30000};
  std::chrono::milliseconds monitor_interval{5000};
  // Descendants still alive this long after SIGKILL are reported and abandoned (a process
  // stuck in the kernel cannot be killed); bounds every wait in run().
  std::chrono::milliseconds kill_wait{10000};
  int console_out = 1;
  int console_err = 2;
  int notice_fd = 2;  // where launcher notices go
  // When >= 0 and readable: stop the workers (SIGTERM, then SIGKILL after term_grace) and
  // return kStopped. The caller owns the fd; it is polled, never read.
  int stop_fd = -1;
  size_t stderr_tail_lines = 40;
  // Stacks (stack_capture.hpp): when the attempt ends because a worker failed or hung, the
  // running workers' stacks are captured first, within this limit (0: not captured), printed
  // folded and written to the attempt folder (stacks.<host>.txt/.json).
  std::chrono::milliseconds stacks_limit{5000};
  StackTools stack_tools;
  // `ddprun stacks`: told which workers run (not owned; may be null).
  StackService* stack_service = nullptr;
  // --hang-timeout (hang_watchdog.hpp): unset = off. With it, Python workers get ddprun's
  // progress hook from `python_hook_dir` (torch_progress.hpp).
  std::optional<std::chrono::milliseconds> hang_timeout;
  std::string python_hook_dir;
  // --recovery step (step_recovery.hpp): called when a worker failed first (no root cause
  // yet); `a_peer_finished`: another worker of the attempt already exited. Returns the
  // restarted worker's TORCHELASTIC_RESTART_COUNT to restart only it (never when a peer
  // finished: none could heal it), or nullopt to fail the attempt as usual. Unset: never
  // called (--recovery group).
  std::function<std::optional<int>(const WorkerFailure&, bool a_peer_finished)> replace_failed;
  // --recovery step with a Python program: the warm spare's command (warm_spare.hpp), in which
  // a rank restarted in place runs; empty: none (a restarted rank is a new process).
  std::vector<std::string> warm_spare_command;
  // --recovery step: called when a worker exited 0 while the attempt runs (its global rank),
  // so the others learn it finished even if it skipped its destructors. Must not throw.
  std::function<void(int global_rank)> on_worker_succeeded;
  // Called once, as soon as the attempt has its root cause (a worker failed: describe_failure's
  // text; or the hang watchdog fired: "rank 3 (local rank 1, pid 812) stopped by ddprun's hang
  // watchdog: <verdict>"), before the other workers are stopped: a multi-node agent ends the
  // round here, so the other nodes learn the cause before their workers lose their peers. Must
  // not throw. Unset: nothing.
  std::function<void(const std::string& cause)> on_root_cause;
};

enum class AttemptOutcome { kSucceeded, kFailed, kInterrupted, kStopped, kRequeue };

struct AttemptResult {
  AttemptOutcome outcome = AttemptOutcome::kSucceeded;
  std::optional<WorkerFailure> root_cause;  // kFailed: the first worker that failed
  std::vector<WorkerFailure> others;        // other non-zero exits (kFailed)
  int signal = 0;  // kInterrupted (kRequeue after a signal): the signal received
  // kFailed (kStopped): every worker's process as ddprun saw it at the first failure (at the
  // stop request), for the hang report.
  std::vector<RankProcess> processes;
  // kFailed, kStopped: where ddprun told the workers to write flight recorder dumps
  // (DDP_FLIGHT_RECORDER_DIR: the attempt folder); "" when the user chose the directory.
  std::string flight_recorder_dir;
  // kFailed, kStopped: the running workers' stacks captured before the stop (empty when none
  // ran or capture is off), and the file they were written to ("" none).
  std::vector<RankStacks> stacks;
  std::string stacks_file;
  // kFailed by the hang watchdog: its verdict ("" otherwise).
  std::string hang;
};

// Runs one attempt. Throws ddp::Error when workers cannot be started (after stopping those
// that were).
AttemptResult run_attempt(const AttemptSpec& spec, SignalChannel& signals);

}  // namespace ddp::launcher
