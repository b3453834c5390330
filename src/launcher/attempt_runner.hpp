#pragma once
// One attempt of the worker group (run_attempt, worker_group.hpp), private to src/launcher:
// AttemptRunner starts the workers, forwards their output and signals, watches them, and on
// the first failure (or a hang) gathers the evidence and stops the others.
//
// Its parts, one file each:
// - worker_group.cpp: the event loop (poll over the workers' pipes, the signal channel and
//   the stop request) and the attempt's outcome;
// - attempt_spawn.cpp: starting a worker (its streams, environment and dump folder), and
//   starting one again in place (--recovery step);
// - attempt_stop.cpp: stopping (SIGTERM, grace, SIGKILL, giving up), reaping;
// - attempt_failure.cpp: what is gathered at the first failure: the processes' states, the
//   running workers' stacks, the flight recorder dumps, the failure record;
// - attempt_kill_evidence.cpp: why a worker died (memory cgroup, kernel log);
// - attempt_hang.cpp: the hang watchdog's checks and verdict.
//
// Invariants: one thread runs the loop and every member; phase_ only moves forward
// (kRunning, optionally kDumping, then kStopping, kKilling), except kDumping, which returns to
// kRunning just before the stop begins; root_cause_, once set, names the worker the attempt
// failed for.

#include <sys/types.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "ddp/launcher/hang_report.hpp"
#include "ddp/launcher/hang_watchdog.hpp"
#include "ddp/launcher/kernel_log.hpp"
#include "ddp/launcher/kill_cause.hpp"
#include "ddp/launcher/memory_cgroup.hpp"
#include "ddp/launcher/output.hpp"
#include "ddp/launcher/process.hpp"
#include "ddp/launcher/signals.hpp"
#include "ddp/launcher/stacks.hpp"
#include "ddp/launcher/warm_spare.hpp"
#include "ddp/launcher/worker_group.hpp"
#include "ddp/util/exit_status.hpp"

namespace ddp::launcher::detail {

using Clock = std::chrono::steady_clock;

struct Worker {
  WorkerIdentity id;
  pid_t pid = -1;
  bool exited = false;
  ExitStatus status;
  std::chrono::system_clock::time_point exit_time;
  bool exited_after_stop = false;
  int64_t peak_rss_kib = -1;           // wait4's ru_maxrss
  std::optional<MemoryCgroup> cgroup;  // its memory cgroup when it started
  KillExplanation kill;                // why it died, when ddprun can tell
  std::string error_file;
  UniqueFd fds[2];  // stdout, stderr read ends
  std::unique_ptr<StreamForwarder> streams[2];
};

// kDumping: a worker failed; the live ones were asked to write their flight records and get
// kDumpWait to do so before the stop begins.
enum class Phase { kRunning, kDumping, kStopping, kKilling };
constexpr std::chrono::milliseconds kDumpWait{2000};
// How long a worker's SIGKILL death waits for the kernel log's out-of-memory record when the
// cgroup counter suggests one: the killer logs its victim just after sending the signal.
constexpr int kKernelLogWaitMs = 100;
// How often the hang watchdog reads the workers' progress records.
constexpr std::chrono::milliseconds kWatchdogPeriod{1000};
// Multi-node: when every rank of this node waits in a collective, the rank behind is on another
// node, whose agent sees it in no collective at about the same moment and stops the job naming
// it (its stack capture, up to DDPRUN_STACKS_TIMEOUT_S, comes first). This node holds its own
// verdict this long, so the report names that rank rather than one of this node's waiting ones;
// it fires itself after it (a node without the watchdog, or a hang where every rank waits).
constexpr std::chrono::milliseconds kRemoteCulpritGrace{15000};

inline int64_t unix_us(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

class AttemptRunner {
 public:
  AttemptRunner(const AttemptSpec& spec, SignalChannel& signals);

  // Runs the attempt to its end: every worker and descendant gone (or abandoned).
  AttemptResult run();

 private:
  // kRequeueExitStatus (util/exit_status.hpp): stopped on request after a checkpoint.
  static bool asks_requeue(const ExitStatus& s) {
    return !s.signaled && s.code == kRequeueExitStatus;
  }
  bool stopping() const { return phase_ == Phase::kStopping || phase_ == Phase::kKilling; }

  // ---- The event loop and the outcome (worker_group.cpp) ----

  // A "ddprun: " line on the notice descriptor.
  void notice(const std::string& text);
  void loop();
  int poll_timeout_ms() const;
  // Reads one chunk; returns true when more may follow right away.
  bool read_stream(Worker& w, int s);
  void handle_signals();
  void forward(int sig);
  bool all_succeeded() const;
  bool all_asked_requeue() const;
  bool any_asked_requeue() const;
  bool all_exited() const;
  AttemptResult result() const;

  // ---- Starting workers (attempt_spawn.cpp) ----

  StreamRoute route_for(const WorkerIdentity& id, const std::string& dir, int stream) const;
  // Opens filtered_[] in attempt_dir_ for the streams that have duplicate filters.
  void open_filtered_logs();
  void start_workers();
  // Starts the worker of rank `id` (at the attempt's start, or again in place: --recovery step,
  // `in_place`, in the warm spare when there is one).
  std::unique_ptr<Worker> spawn_worker(const WorkerIdentity& id, int restart_count, bool in_place);
  // How the worker of rank `id` is started: argv, environment, CPUs, tracer.
  SpawnOptions worker_spawn_options(const WorkerIdentity& id, int restart_count,
                                    const std::string& error_file);
  // The rank's process started in place: in the warm spare when one is ready (then another
  // is started), else a new one.
  SpawnedProcess spawn_in_place(const WorkerIdentity& id, const SpawnOptions& so);
  // --recovery step with a Python program (spec_.warm_spare_command): starts the warm spare
  // (warm_spare.hpp) unless one runs, one failed by itself in this attempt, or the attempt
  // stops.
  void start_spare();
  // Kills the warm spare (the attempt ends; reaped like any child).
  void retire_spare();
  // --recovery step: offers the failed worker `w` to spec_.replace_failed and, when it agrees,
  // starts its rank again in w's slot. The old worker's output is drained and closed first
  // (it is reaped; a descendant still holding its pipes loses the rest of its output).
  bool replace_in_place(Worker& w);
  // Tells `ddprun stacks` which workers run now.
  void publish_workers();

  // ---- Stopping and reaping (attempt_stop.cpp) ----

  // SIGTERM (or already-forwarded `sig` when 0) to every worker group and adopted descendant;
  // SIGKILL after the grace period.
  // A stopped worker (SIGSTOP, job control) acts on SIGTERM only once continued: SIGCONT
  // follows, as a shell's `kill` does, so it does not wait out the grace period.
  void begin_stop(int sig);
  void terminate_adopted(int sig);
  bool is_worker(pid_t pid) const;
  void begin_kill();
  void kill_everything();
  // The current phase's timed steps: the end of the dump wait, SIGKILL after the grace period,
  // giving up on processes that outlive SIGKILL by kill_wait.
  void on_clock();
  // Reaps every exited child (workers and adopted descendants) without blocking.
  void reap();
  // One line per worker (or descendant left behind) in uninterruptible sleep among `pids`
  // (all live workers when empty): the reason a stop can take long, or fail.
  void notice_uninterruptible(const std::vector<pid_t>& pids = {});
  const Worker* worker_with_pid(pid_t pid) const;

  // ---- What the first failure gathers (attempt_failure.cpp) ----

  // Worker `w` exited (wait `status`): records how, and when it failed while the workers run,
  // restarts its rank (--recovery step) or makes it the root cause, gathers the evidence and
  // starts the stop.
  void on_worker_exit(Worker& w, int status, long peak_rss_kib);
  // What each worker's process is doing now, for the hang report (hang_report.hpp).
  std::vector<RankProcess> snapshot_processes() const;
  // After the first failure: asks every live, running worker that handles the dump signal and
  // has no record yet to write one (a rank that died leaves the others waiting in a collective
  // they would only give up at their timeout). Returns whether any was asked.
  bool request_dumps();
  WorkerFailure failure_of(const Worker& w) const;
  // The running workers' stacks, before ddprun stops them: printed folded (main threads; every
  // thread goes to the file) and written to the attempt folder. Bounded by stacks_limit.
  void capture_running_stacks(const std::string& headline);
  // Whether every rank request_dumps asked has written its record (kDumping).
  bool dumps_written() const;

  // ---- Why a worker died (attempt_kill_evidence.cpp) ----

  // The worker's memory cgroup and, the first time this attempt sees that cgroup, its
  // out-of-memory kill count: kills counted later are this attempt's (kill_cause.hpp).
  void note_memory_cgroup(Worker& w);
  // Evidence of how `w` died (memory_cgroup.hpp, kernel_log.hpp) and what it means. Runs only
  // for a worker that failed; waits at most kKernelLogWaitMs, for the kernel log.
  KillExplanation explain(const Worker& w);
  void read_kernel_log();
  // The kernel log's "Out of memory: Killed process" record (preferred) or "oom-kill:" record
  // naming pid; nullptr when none.
  const OomKillRecord* kernel_log_names(pid_t pid) const;

  // ---- The hang watchdog (attempt_hang.cpp) ----

  // The watchdog's check, every kWatchdogPeriod while the workers run.
  void watch_progress();
  // No progress: the rank in no collective (else the lowest waiting one) stands as the root
  // cause; the others' stacks and records are gathered as after a failure, then all stop.
  void on_hang(const std::string& verdict);

  const AttemptSpec& spec_;
  SignalChannel& signals_;
  pid_t self_;
  std::vector<std::unique_ptr<Worker>> workers_;
  Phase phase_ = Phase::kRunning;
  Clock::time_point kill_at_;
  Clock::time_point give_up_at_;
  Clock::time_point dump_until_;
  std::string dump_dir_;            // DDP_FLIGHT_RECORDER_DIR as ddprun set it ("" : the user's)
  std::vector<int> dump_waiting_;   // ranks asked for a record (kDumping)
  std::vector<int> torch_waiting_;  // ranks asked for PyTorch's record, through the hook
  std::string attempt_dir_;         // ROOT/attempt_<n>
  // filtered_stdout.log, filtered_stderr.log of the attempt (--duplicate-*-filters), or closed.
  UniqueFd filtered_[2];
  std::optional<HangWatchdog> watchdog_;
  Clock::time_point next_watch_;
  // Multi-node: when this node's verdict, held for kRemoteCulpritGrace, fires.
  std::optional<Clock::time_point> hang_held_until_;
  std::string hang_;  // the watchdog's verdict, once it fired
  bool stacks_captured_ = false;
  std::vector<RankStacks> stacks_;
  std::string stacks_file_;
  std::vector<RankProcess> processes_;  // at the first failure
  bool children_remain_ = true;
  bool abandoned_ = false;
  std::set<pid_t> termed_;
  // Kill evidence (kill_cause.hpp): the kernel log read from the attempt's start, the OOM
  // victims it named, the oom_kill count of each memory cgroup already accounted for, and the
  // workers already explained as out-of-memory kills.
  KernelLog kernel_log_;
  std::vector<OomKillRecord> oom_records_;
  std::map<std::string, uint64_t> oom_kills_seen_;
  std::set<pid_t> explained_victims_;
  Worker* root_cause_ = nullptr;
  int interrupt_signal_ = 0;
  bool stop_requested_ = false;
  bool requeue_noted_ = false;  // the first worker's kRequeueExitStatus was announced
  // The warm spare, while one waits; spare_failed_: one exited by itself (none is started
  // again in this attempt).
  std::optional<WarmSpare> spare_;
  bool spare_failed_ = false;
};

}  // namespace ddp::launcher::detail
