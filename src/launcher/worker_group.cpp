#include "ddp/launcher/worker_group.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>
#include <set>

#include "ddp/launcher/hang_report.hpp"
#include "ddp/launcher/hang_watchdog.hpp"
#include "ddp/launcher/kernel_log.hpp"
#include "ddp/launcher/kill_cause.hpp"
#include "ddp/launcher/memory_cgroup.hpp"
#include "ddp/launcher/output.hpp"
#include "ddp/launcher/run_directory.hpp"
#include "ddp/launcher/stack_service.hpp"
#include "ddp/launcher/torch_progress.hpp"
#include "ddp/launcher/worker_env.hpp"
#include "ddp/util/deadline.hpp"
#include "ddp/util/dump_signal.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/exit_status.hpp"

namespace ddp::launcher {

namespace {

// Removes flight_recorder.*.rank<R>.json of this node's ranks R from an attempt folder (other
// nodes may share it). Best effort.
void remove_flight_dumps(const std::string& attempt_dir, const WorldAssignment& world) {
  std::error_code ec;
  std::vector<std::filesystem::path> stale;
  for (const auto& e : std::filesystem::directory_iterator(attempt_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("flight_recorder.", 0) != 0) continue;
    for (const auto& id : world.workers) {
      const std::string suffix = fmt::format(".rank{}.json", id.global_rank);
      if (name.size() > suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        stale.push_back(e.path());
      }
    }
  }
  for (const auto& p : stale) std::filesystem::remove(p, ec);
}

// Removes the progress records, PyTorch recorder dumps and the dump request that an earlier run
// with the same run id left in the attempt folder (torch_progress.hpp). Best effort.
void remove_torch_progress(const std::string& attempt_dir, const WorldAssignment& world) {
  std::error_code ec;
  for (const auto& id : world.workers) {
    std::filesystem::remove(fmt::format("{}/progress.rank{}.json", attempt_dir, id.global_rank),
                            ec);
    std::filesystem::remove(fmt::format("{}/progress.rank{}.ddp.json", attempt_dir, id.global_rank),
                            ec);
    std::filesystem::remove(fmt::format("{}/torch_fr.rank{}.json", attempt_dir, id.global_rank),
                            ec);
  }
  std::filesystem::remove(attempt_dir + "/torch_fr.request", ec);
}

bool file_exists(const std::string& path) {
  std::error_code ec;
  return std::filesystem::exists(path, ec);
}

// Whether attempt_dir holds a flight recorder dump of `global_rank` (any group).
bool has_flight_dump(const std::string& attempt_dir, int global_rank) {
  std::error_code ec;
  const std::string suffix = fmt::format(".rank{}.json", global_rank);
  for (const auto& e : std::filesystem::directory_iterator(attempt_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind("flight_recorder.", 0) == 0 && name.size() > suffix.size() &&
        name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0) {
      return true;
    }
  }
  return false;
}

// Whether process `pid` has a handler for `sig` (the SigCgt mask of /proc/<pid>/status).
bool catches_signal(pid_t pid, int sig) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("SigCgt:", 0) != 0) continue;
    const uint64_t mask = std::strtoull(line.c_str() + 7, nullptr, 16);
    return sig >= 1 && sig <= 64 && ((mask >> (sig - 1)) & 1) != 0;
  }
  return false;
}

int64_t unix_us(std::chrono::system_clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

}  // namespace

namespace {

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

class AttemptRunner {
 public:
  AttemptRunner(const AttemptSpec& spec, SignalChannel& signals)
      : spec_(spec), signals_(signals), self_(::getpid()) {
    if (spec_.hang_timeout) watchdog_.emplace(*spec_.hang_timeout);
  }

  AttemptResult run() {
    std::exception_ptr start_error;
    try {
      start_workers();
    } catch (...) {
      start_error = std::current_exception();
      begin_stop(SIGTERM);
    }
    loop();
    if (start_error) std::rethrow_exception(start_error);
    return result();
  }

 private:
  void notice(const std::string& text) {
    std::string line = "ddprun: " + text + "\n";
    write_fully(spec_.notice_fd, line.data(), line.size());
  }

  StreamRoute route_for(const WorkerIdentity& id, const std::string& dir, int stream) const {
    Std red = spec_.redirects.for_local_rank(id.local_rank);
    Std tee = spec_.tee.for_local_rank(id.local_rank);
    bool is_out = stream == 0;
    bool teed = is_out ? includes_stdout(tee) : includes_stderr(tee);
    bool redirected = is_out ? includes_stdout(red) : includes_stderr(red);
    bool shown =
        !spec_.local_ranks_filter || std::count(spec_.local_ranks_filter->begin(),
                                                spec_.local_ranks_filter->end(), id.local_rank) > 0;
    StreamRoute route;
    route.console_fd =
        shown && (teed || !redirected) ? (is_out ? spec_.console_out : spec_.console_err) : -1;
    if (teed) route.prefix = fmt::format("[{}{}]:", spec_.role, id.global_rank);
    if (spec_.write_logs || teed || redirected) {
      route.log_path = dir + (is_out ? "/stdout.log" : "/stderr.log");
    }
    route.tail_lines = is_out ? 0 : spec_.stderr_tail_lines;
    return route;
  }

  void start_workers() {
    const WorldAssignment& world = *spec_.world;
    workers_.reserve(world.workers.size());
    kernel_log_ = KernelLog::open_at_end();  // before any worker can be killed
    bool first = true;
    for (const auto& id : world.workers) {
      std::string dir = spec_.run_dir->rank_dir(spec_.attempt, id.global_rank);
      if (first) {
        attempt_dir_ = dir.substr(0, dir.rfind('/'));
        // Stale dumps of a reused run id must not be reported as this attempt's hang.
        remove_flight_dumps(attempt_dir_, world);
        remove_torch_progress(attempt_dir_, world);
      }
      first = false;
      workers_.push_back(spawn_worker(id, spec_.restart_count, /*append_logs=*/false));
    }
    publish_workers();
    next_watch_ = Clock::now() + kWatchdogPeriod;
  }

  // Starts the worker of rank `id` (at the attempt's start, or again in place: --recovery step).
  std::unique_ptr<Worker> spawn_worker(const WorkerIdentity& id, int restart_count,
                                       bool append_logs) {
    const WorldAssignment& world = *spec_.world;
    std::string dir = spec_.run_dir->rank_dir(spec_.attempt, id.global_rank);
    {
      auto w = std::make_unique<Worker>();
      w->id = id;
      w->error_file = dir + "/error.json";
      ::unlink(w->error_file.c_str());  // a stale file must not be reported as this failure
      for (int s = 0; s < 2; ++s) {
        StreamRoute route = route_for(id, dir, s);
        route.append = append_logs;
        w->streams[s] = std::make_unique<StreamForwarder>(std::move(route));
      }
      WorkerEnvInputs env;
      env.world = &world;
      env.worker = id;
      env.role = spec_.role;
      env.run_id = spec_.run_id;
      env.restart_count = restart_count;
      env.max_restarts = spec_.max_restarts;
      env.error_file = w->error_file;
      env.set_omp_threads = spec_.set_omp_threads;
      SpawnOptions so;
      so.argv = spec_.command;
      so.env = build_worker_env(spec_.base_env, env);
      // Flight recorder dumps go beside the rank folders of this attempt, where the hang
      // report and `ddprun trace` find them (without --log-dir that is ddprun's temporary
      // ROOT, removed at exit), unless the user chose a directory.
      if (std::none_of(so.env.begin(), so.env.end(), [](const std::string& e) {
            return e.rfind("DDP_FLIGHT_RECORDER_DIR=", 0) == 0;
          })) {
        dump_dir_ = dir.substr(0, dir.rfind('/'));
        set_env_entry(so.env, "DDP_FLIGHT_RECORDER_DIR", dump_dir_);
      }
      if (!spec_.python_hook_dir.empty()) {
        add_torch_progress_env(so.env, spec_.python_hook_dir, attempt_dir_);
      }
      SpawnedProcess p = spawn_process(so);
      w->pid = p.pid;
      note_memory_cgroup(*w);
      w->fds[0] = std::move(p.stdout_read);
      w->fds[1] = std::move(p.stderr_read);
      return w;
    }
  }

  // --recovery step: offers the failed worker `w` to spec_.replace_failed and, when it agrees,
  // starts its rank again in w's slot. The old worker's output is drained and closed first
  // (it is reaped; a descendant still holding its pipes loses the rest of its output).
  bool replace_in_place(Worker& w) {
    if (!spec_.replace_failed || phase_ != Phase::kRunning || root_cause_ != nullptr) return false;
    // A peer that already finished cannot heal the replacement: fail as with --recovery group.
    for (const auto& other : workers_) {
      if (other.get() != &w && other->exited) return false;
    }
    std::optional<int> restart_count = spec_.replace_failed(failure_of(w));
    if (!restart_count) return false;
    for (int s = 0; s < 2; ++s) {
      while (w.fds[s].valid() && read_stream(w, s)) {
      }
      w.fds[s].reset();
      w.streams[s]->finish();
    }
    std::unique_ptr<Worker> fresh;
    try {
      fresh = spawn_worker(w.id, *restart_count, /*append_logs=*/true);
    } catch (const Error& e) {
      notice(fmt::format("cannot restart rank {}: {}", w.id.global_rank, e.what()));
      return false;  // the attempt fails as with --recovery group
    }
    for (auto& slot : workers_) {
      if (slot.get() == &w) slot = std::move(fresh);
    }
    publish_workers();
    return true;
  }

  // Tells `ddprun stacks` which workers run now.
  void publish_workers() {
    if (spec_.stack_service == nullptr) return;
    std::vector<StackTarget> live;
    for (const auto& w : workers_) {
      if (!w->exited) live.push_back({w->id.global_rank, w->pid});
    }
    spec_.stack_service->set_workers(std::move(live));
  }

  // The running workers' stacks, before ddprun stops them: printed folded (main threads; every
  // thread goes to the file) and written to the attempt folder. Bounded by stacks_limit.
  void capture_running_stacks(const std::string& headline) {
    if (spec_.stacks_limit.count() <= 0 || stacks_captured_) return;
    stacks_captured_ = true;
    std::vector<StackTarget> targets;
    for (const auto& w : workers_) {
      if (!w->exited && process_state(w->pid) != RankProcess::State::kExited) {
        targets.push_back({w->id.global_rank, w->pid});
      }
    }
    if (targets.empty()) return;
    std::vector<std::string> notes;
    if (spec_.stack_service != nullptr) {
      // In a multi-node round with an authenticated store the other nodes' workers, still
      // running, are captured too (their agents answer as for `ddprun stacks`).
      publish_workers();
      auto got = spec_.stack_service->capture_all_nodes(deadline_after(spec_.stacks_limit));
      stacks_ = std::move(got.stacks);
      notes = std::move(got.notes);
    } else {
      stacks_ = capture_stacks(targets, spec_.host, spec_.stack_tools,
                               deadline_after(spec_.stacks_limit));
    }
    const std::string summary = stacks_summary(stacks_);
    notice(headline.empty() ? summary : headline + "; " + summary);
    if (!attempt_dir_.empty()) {
      const std::string base = fmt::format("{}/stacks.{}", attempt_dir_, spec_.host);
      std::ofstream txt(base + ".txt", std::ios::trunc);
      for (const auto& line : format_folded(stacks_)) txt << line << '\n';
      std::ofstream json(base + ".json", std::ios::trunc);
      json << encode_stacks(stacks_) << '\n';
      if (txt && json) stacks_file_ = base + ".txt";
    }
    notice(fmt::format("stacks of the running workers, folded{}:",
                       stacks_file_.empty() ? "" : " (every thread: " + stacks_file_ + ")"));
    for (const auto& line : format_folded(stacks_, /*main_thread_only=*/true)) notice("  " + line);
    for (const auto& note : notes) notice("stacks: " + note);
  }

  // The worker's memory cgroup and, the first time this attempt sees that cgroup, its
  // out-of-memory kill count: kills counted later are this attempt's (kill_cause.hpp).
  void note_memory_cgroup(Worker& w) {
    w.cgroup = memory_cgroup_of(w.pid);
    if (!w.cgroup || oom_kills_seen_.count(w.cgroup->dir) > 0) return;
    if (auto count = read_oom_kill_count(*w.cgroup)) oom_kills_seen_[w.cgroup->dir] = *count;
  }

  // Evidence of how `w` died (memory_cgroup.hpp, kernel_log.hpp) and what it means. Runs only
  // for a worker that failed; waits at most kKernelLogWaitMs, for the kernel log.
  KillExplanation explain(const Worker& w) {
    KillEvidence e;
    e.peak_rss_kib = w.peak_rss_kib;
    if (w.cgroup) {
      e.cgroup = w.cgroup->dir;
      const auto seen = oom_kills_seen_.find(w.cgroup->dir);
      if (seen != oom_kills_seen_.end()) e.oom_kills_before = seen->second;
      e.oom_kills_now = read_oom_kill_count(*w.cgroup);
      const MemoryLimitInfo limit = read_memory_limit(*w.cgroup);
      e.limit_read = limit.read;
      e.limit_cgroup = limit.dir;
      e.limit_bytes = limit.bytes;
      e.limit_peak_bytes = limit.peak;
    }
    const bool sigkill = w.status.signaled && w.status.code == SIGKILL;
    const bool counter_rose =
        e.oom_kills_before && e.oom_kills_now && *e.oom_kills_now > *e.oom_kills_before;
    if (kernel_log_.readable()) {
      e.kernel_log_read = true;
      auto named = [&] { return kernel_log_names(w.pid) != nullptr; };
      read_kernel_log();
      // Not for ddprun's own SIGKILLs with nothing pointing at the OOM killer.
      if (sigkill && !named() && (counter_rose || (!e.oom_kills_now && !w.exited_after_stop))) {
        const auto until = Clock::now() + std::chrono::milliseconds(kKernelLogWaitMs);
        while (!named() && Clock::now() < until) {
          const auto left =
              std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now());
          if (!kernel_log_.wait_for_record(static_cast<int>(left.count()) + 1)) break;
          read_kernel_log();
        }
      }
      if (const OomKillRecord* r = kernel_log_names(w.pid)) e.kernel_log_record = r->text;
      for (const auto& r : oom_records_) {
        if (r.pid != w.pid && explained_victims_.count(r.pid) == 0 &&
            std::find(e.other_victims.begin(), e.other_victims.end(), r.pid) ==
                e.other_victims.end()) {
          e.other_victims.push_back(r.pid);
        }
      }
    }
    KillExplanation k = explain_exit(w.status, w.exited_after_stop, e);
    // Each counted kill explains one death.
    if (k.consumed_oom_kill && w.cgroup && e.oom_kills_before) {
      oom_kills_seen_[w.cgroup->dir] = *e.oom_kills_before + 1;
    }
    if (k.cause == KillCause::kOutOfMemory) explained_victims_.insert(w.pid);
    return k;
  }

  void read_kernel_log() {
    for (auto& r : kernel_log_.read_oom_kills()) oom_records_.push_back(std::move(r));
  }

  // The kernel log's "Out of memory: Killed process" record (preferred) or "oom-kill:" record
  // naming pid; nullptr when none.
  const OomKillRecord* kernel_log_names(pid_t pid) const {
    const OomKillRecord* found = nullptr;
    for (const auto& r : oom_records_) {
      if (r.pid != pid) continue;
      if (found == nullptr || r.text.rfind("oom-kill:", 0) != 0) found = &r;
    }
    return found;
  }

  // One line per worker (or descendant left behind) in uninterruptible sleep among `pids`
  // (all live workers when empty): the reason a stop can take long, or fail.
  void notice_uninterruptible(const std::vector<pid_t>& pids = {}) {
    std::vector<pid_t> check = pids;
    if (pids.empty()) {
      for (const auto& w : workers_) {
        if (!w->exited) check.push_back(w->pid);
      }
    }
    for (pid_t pid : check) {
      if (process_state(pid) != RankProcess::State::kUninterruptible) continue;
      const Worker* w = worker_with_pid(pid);
      notice(w != nullptr ? describe_uninterruptible(w->id.global_rank, pid, read_wchan(pid))
                          : fmt::format("pid {} (left behind by a worker) {}", pid,
                                        uninterruptible_text(read_wchan(pid))));
    }
  }

  const Worker* worker_with_pid(pid_t pid) const {
    for (const auto& w : workers_) {
      if (w->pid == pid) return w.get();
    }
    return nullptr;
  }

  bool all_succeeded() const {
    return std::all_of(workers_.begin(), workers_.end(),
                       [](const auto& w) { return w->exited && w->status.success(); });
  }

  // kRequeueExitStatus (util/exit_status.hpp): stopped on request after a checkpoint.
  static bool asks_requeue(const ExitStatus& s) {
    return !s.signaled && s.code == kRequeueExitStatus;
  }

  bool all_asked_requeue() const {
    return std::all_of(workers_.begin(), workers_.end(),
                       [](const auto& w) { return w->exited && asks_requeue(w->status); });
  }

  bool any_asked_requeue() const {
    return std::any_of(workers_.begin(), workers_.end(),
                       [](const auto& w) { return w->exited && asks_requeue(w->status); });
  }

  bool all_exited() const {
    return std::all_of(workers_.begin(), workers_.end(), [](const auto& w) { return w->exited; });
  }

  bool pipes_open() const {
    for (const auto& w : workers_) {
      if (w->fds[0].valid() || w->fds[1].valid()) return true;
    }
    return false;
  }

  void loop() {
    for (;;) {
      if (all_exited()) {
        reap();
        if (!children_remain_) break;
        // Workers are done but adopted descendants linger: stop them too.
        if (!stopping()) begin_stop(SIGTERM);
      }
      std::vector<pollfd> fds;
      std::vector<std::pair<Worker*, int>> owners;
      fds.push_back({signals_.fd(), POLLIN, 0});
      owners.emplace_back(nullptr, 0);
      // The stop request is polled until it fires once; it stays readable afterwards.
      const bool watch_stop = spec_.stop_fd >= 0 && !stop_requested_;
      fds.push_back({watch_stop ? spec_.stop_fd : -1, POLLIN, 0});
      owners.emplace_back(nullptr, 0);
      for (auto& w : workers_) {
        for (int s = 0; s < 2; ++s) {
          if (w->fds[s].valid()) {
            fds.push_back({w->fds[s].get(), POLLIN, 0});
            owners.emplace_back(w.get(), s);
          }
        }
      }
      int n = ::poll(fds.data(), fds.size(), poll_timeout_ms());
      if (n < 0 && errno != EINTR)
        throw Error(fmt::format("poll failed: {}", std::strerror(errno)));
      for (size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents != 0) read_stream(*owners[i].first, owners[i].second);
      }
      if (fds[0].revents != 0) handle_signals();
      if (watch_stop && fds[1].revents != 0) {
        stop_requested_ = true;
        // With a root cause of its own this node is already on its way to the stop (the round
        // ended because it said so: on_root_cause): its dump wait must not be cut short.
        if (!stopping() && root_cause_ == nullptr) {
          if (phase_ == Phase::kRunning) {
            processes_ = snapshot_processes();  // the hang report of a multi-node run
            capture_running_stacks("stopped by another node");
          }
          begin_stop(SIGTERM);
        }
      }
      reap();
      on_clock();
    }
    // Every descendant is gone, so every writer is closed: read what is left and finish.
    for (auto& w : workers_) {
      for (int s = 0; s < 2; ++s) {
        while (w->fds[s].valid() && read_stream(*w, s)) {
        }
        w->fds[s].reset();
        w->streams[s]->finish();
      }
    }
  }

  int poll_timeout_ms() const {
    auto until = [](Clock::time_point t) {
      auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
      return static_cast<int>(std::clamp<int64_t>(ms + 1, 0, 1 << 30));
    };
    switch (phase_) {
      case Phase::kRunning:
        return watchdog_ ? std::min<int>(static_cast<int>(spec_.monitor_interval.count()),
                                         until(next_watch_))
                         : static_cast<int>(spec_.monitor_interval.count());
      case Phase::kDumping:
        return std::min(50, until(dump_until_));
      case Phase::kStopping:
        return until(kill_at_);
      case Phase::kKilling:
        // Re-scan for adopted descendants now and then: they may be reparented to us at
        // any moment and need their own SIGKILL.
        return std::min(50, until(give_up_at_));
    }
    return -1;
  }

  // Reads one chunk; returns true when more may follow right away.
  bool read_stream(Worker& w, int s) {
    char buf[65536];
    ssize_t n = ::read(w.fds[s].get(), buf, sizeof(buf));
    if (n > 0) {
      w.streams[s]->feed(buf, static_cast<size_t>(n));
      return true;
    }
    if (n < 0 && (errno == EINTR)) return true;
    if (n < 0 && errno == EAGAIN) return false;
    w.fds[s].reset();  // EOF or error
    w.streams[s]->finish();
    return false;
  }

  void handle_signals() {
    for (int sig : signals_.drain()) {
      if (sig == SIGCHLD) continue;  // reap() runs after every wake-up
      if (is_forward_only_signal(sig)) {
        forward(sig);
      } else if (is_terminating_signal(sig)) {
        if (interrupt_signal_ != 0) {
          notice(fmt::format("received {} again; killing the workers now", signal_name(sig)));
          begin_kill();
          continue;
        }
        interrupt_signal_ = sig;
        notice(fmt::format("received {}; forwarding it to the workers and stopping them",
                           signal_name(sig)));
        forward(sig);
        if (!stopping()) begin_stop(0);
      }
    }
  }

  void forward(int sig) {
    for (auto& w : workers_) signal_process_group(w->pid, sig);
  }

  // SIGTERM (or already-forwarded `sig` when 0) to every worker group and adopted descendant;
  // SIGKILL after the grace period.
  // A stopped worker (SIGSTOP, job control) acts on SIGTERM only once continued: SIGCONT
  // follows, as a shell's `kill` does, so it does not wait out the grace period.
  void begin_stop(int sig) {
    if (stopping()) return;
    phase_ = Phase::kStopping;
    kill_at_ = deadline_after(spec_.term_grace);
    if (sig != 0) forward(sig);
    forward(SIGCONT);
    terminate_adopted(sig == 0 ? SIGTERM : sig);
  }

  bool stopping() const { return phase_ == Phase::kStopping || phase_ == Phase::kKilling; }

  // What each worker's process is doing now, for the hang report (hang_report.hpp).
  std::vector<RankProcess> snapshot_processes() const {
    std::vector<RankProcess> out;
    const int64_t now = unix_us(std::chrono::system_clock::now());
    for (const auto& w : workers_) {
      RankProcess p;
      p.global_rank = w->id.global_rank;
      p.pid = w->pid;
      p.host = spec_.host;
      if (w->exited) {
        p.state = RankProcess::State::kExited;
        if (w->kill.cause == KillCause::kOutOfMemory) {
          p.exit = "was killed by the kernel's out-of-memory killer (SIGKILL)";
        } else {
          p.exit = w->status.signaled ? fmt::format("was killed by {}", signal_name(w->status.code))
                                      : fmt::format("exited with code {}", w->status.code);
        }
        p.at_us = unix_us(w->exit_time);
      } else {
        p.state = process_state(w->pid);
        p.at_us = now;
        if (p.state == RankProcess::State::kExited) p.exit = "exited";
        if (p.state == RankProcess::State::kUninterruptible) p.wchan = read_wchan(w->pid);
      }
      out.push_back(std::move(p));
    }
    return out;
  }

  // After the first failure: asks every live, running worker that handles the dump signal and
  // has no record yet to write one (a rank that died leaves the others waiting in a collective
  // they would only give up at their timeout). Returns whether any was asked.
  bool request_dumps() {
    if (dump_dir_.empty()) return false;
    const int sig = flight_recorder_dump_signal();
    dump_waiting_.clear();
    torch_waiting_.clear();
    if (!spec_.python_hook_dir.empty() && !attempt_dir_.empty()) {
      // PyTorch's recorder, through the hook of the ranks that reported progress.
      std::ofstream(attempt_dir_ + "/torch_fr.request", std::ios::trunc) << "dump\n";
      for (const auto& w : workers_) {
        if (!w->exited && read_progress(attempt_dir_, w->id.global_rank)) {
          torch_waiting_.push_back(w->id.global_rank);
        }
      }
    }
    for (const auto& w : workers_) {
      if (w->exited || process_state(w->pid) != RankProcess::State::kRunning) continue;
      if (has_flight_dump(dump_dir_, w->id.global_rank) || !catches_signal(w->pid, sig)) continue;
      if (::kill(w->pid, sig) == 0) dump_waiting_.push_back(w->id.global_rank);
    }
    if (dump_waiting_.empty() && torch_waiting_.empty()) return false;
    phase_ = Phase::kDumping;
    dump_until_ = deadline_after(kDumpWait);
    return true;
  }

  void terminate_adopted(int sig) {
    for (pid_t child : list_children(self_)) {
      if (is_worker(child) || termed_.count(child) > 0) continue;
      termed_.insert(child);
      ::kill(child, sig);
    }
  }

  bool is_worker(pid_t pid) const {
    for (const auto& w : workers_) {
      if (w->pid == pid && !w->exited) return true;
    }
    return false;
  }

  void begin_kill() {
    if (phase_ != Phase::kKilling) {
      phase_ = Phase::kKilling;
      give_up_at_ = deadline_after(spec_.kill_wait);
    }
    kill_everything();
  }

  void kill_everything() {
    for (auto& w : workers_) signal_process_group(w->pid, SIGKILL);
    for (pid_t child : list_children(self_)) {
      ::kill(child, SIGKILL);
      ::kill(-child, SIGKILL);  // its group, when it leads one (no-op otherwise)
    }
  }

  void on_clock() {
    watch_progress();
    auto now = Clock::now();
    if (phase_ == Phase::kDumping) {
      const bool all_dumped =
          std::all_of(dump_waiting_.begin(), dump_waiting_.end(),
                      [&](int rank) { return has_flight_dump(dump_dir_, rank); }) &&
          std::all_of(torch_waiting_.begin(), torch_waiting_.end(), [&](int rank) {
            return file_exists(fmt::format("{}/torch_fr.rank{}.json", attempt_dir_, rank));
          });
      if (all_dumped || now >= dump_until_) {
        phase_ = Phase::kRunning;
        begin_stop(SIGTERM);
      }
      return;
    }
    if (phase_ == Phase::kStopping) {
      if (now >= kill_at_) {
        notice(fmt::format("workers still running {:.1f} s after SIGTERM; sending SIGKILL",
                           spec_.term_grace.count() / 1000.0));
        notice_uninterruptible();
        begin_kill();
      } else {
        terminate_adopted(SIGTERM);
      }
    } else if (phase_ == Phase::kKilling) {
      if (now >= give_up_at_) {
        auto left = list_children(self_);
        std::string pids;
        for (pid_t p : left) pids += " " + std::to_string(p);
        notice(
            fmt::format("processes still alive {} ms after SIGKILL (stuck in the kernel?), "
                        "abandoning them:{}",
                        spec_.kill_wait.count(), pids));
        if (!left.empty()) notice_uninterruptible(left);
        children_remain_ = false;
        for (auto& w : workers_) {
          if (!w->exited) {
            w->exited = true;
            w->status = ExitStatus{true, SIGKILL};
            w->exit_time = std::chrono::system_clock::now();
            w->exited_after_stop = true;
          }
        }
        abandoned_ = true;
      } else {
        kill_everything();
      }
    }
  }

  // Reaps every exited child (workers and adopted descendants) without blocking.
  void reap() {
    if (abandoned_) return;
    for (;;) {
      int status = 0;
      rusage usage{};
      pid_t pid = ::wait4(-1, &status, WNOHANG, &usage);
      if (pid < 0) {
        if (errno == EINTR) continue;
        children_remain_ = false;  // ECHILD: nobody left
        return;
      }
      if (pid == 0) {
        children_remain_ = true;
        return;
      }
      termed_.erase(pid);
      for (auto& w : workers_) {
        if (w->pid == pid && !w->exited) on_worker_exit(*w, status, usage.ru_maxrss);
      }
    }
  }

  void on_worker_exit(Worker& w, int status, long peak_rss_kib) {
    w.exited = true;
    w.status = ExitStatus::from_wait_status(status);
    w.exit_time = std::chrono::system_clock::now();
    w.exited_after_stop = stopping();
    w.peak_rss_kib = peak_rss_kib;
    publish_workers();
    if (!w.status.success() && !asks_requeue(w.status)) w.kill = explain(w);
    // Its output is in the pipe already; read it now so the report sees the stderr tail.
    for (int s = 0; s < 2; ++s) {
      while (w.fds[s].valid() && read_stream(w, s)) {
      }
    }
    if (asks_requeue(w.status) && !requeue_noted_) {
      requeue_noted_ = true;
      notice(
          fmt::format("rank {} (pid {}) exited with {}: it stopped on request and asks to be "
                      "started again later; waiting for the other workers, no restart",
                      w.id.global_rank, w.pid, kRequeueExitStatus));
    }
    if (w.status.success() && spec_.on_worker_succeeded) {
      spec_.on_worker_succeeded(w.id.global_rank);
    }
    if (w.status.success() || asks_requeue(w.status) || phase_ != Phase::kRunning) return;
    if (replace_in_place(w)) return;  // w is gone: --recovery step restarted its rank
    root_cause_ = &w;
    notice(fmt::format("{}; stopping the other workers", describe_failure(failure_of(w))));
    if (spec_.on_root_cause) spec_.on_root_cause(describe_failure(failure_of(w)));
    processes_ = snapshot_processes();  // before the stop changes what they are doing
    for (const auto& p : processes_) {
      if (p.state == RankProcess::State::kUninterruptible) {
        notice(describe_uninterruptible(p.global_rank, p.pid, p.wchan));
      }
    }
    capture_running_stacks(describe_failure(failure_of(w)));
    if (!request_dumps()) begin_stop(SIGTERM);
  }

  // The watchdog's check, every kWatchdogPeriod while the workers run.
  void watch_progress() {
    if (!watchdog_ || phase_ != Phase::kRunning || root_cause_ != nullptr) return;
    const auto now = Clock::now();
    if (now < next_watch_) return;
    next_watch_ = now + kWatchdogPeriod;
    std::vector<int> ranks;
    std::vector<RankProgress> records;
    for (const auto& w : workers_) {
      if (w->exited) continue;
      ranks.push_back(w->id.global_rank);
      if (auto p = read_progress(attempt_dir_, w->id.global_rank)) records.push_back(*p);
    }
    auto verdict =
        watchdog_->observe(ranks, records, now, unix_us(std::chrono::system_clock::now()));
    if (!verdict) {
      hang_held_until_.reset();
      return;
    }
    if (spec_.world->group_world_size > 1 && watchdog_->idle().empty()) {
      if (!hang_held_until_) {
        hang_held_until_ = now + kRemoteCulpritGrace;
        notice(fmt::format(
            "hang: {}; every rank of this node waits in a collective, so the rank behind is "
            "likely on another node: waiting {:.0f} s for that node's report before stopping",
            *verdict, kRemoteCulpritGrace.count() / 1000.0));
      }
      if (now < *hang_held_until_) return;
    }
    on_hang(*verdict);
  }

  // No progress: the rank in no collective (else the lowest waiting one) stands as the root
  // cause; the others' stacks and records are gathered as after a failure, then all stop.
  void on_hang(const std::string& verdict) {
    hang_ = verdict;
    const std::vector<int>& pick =
        watchdog_->idle().empty() ? watchdog_->waiting() : watchdog_->idle();
    for (auto& w : workers_) {
      if (!w->exited && !pick.empty() && w->id.global_rank == pick.front()) root_cause_ = w.get();
    }
    if (root_cause_ == nullptr) {
      for (auto& w : workers_) {
        if (!w->exited && root_cause_ == nullptr) root_cause_ = w.get();
      }
    }
    notice("hang: " + verdict + "; stopping the workers");
    if (spec_.on_root_cause && root_cause_ != nullptr) {
      spec_.on_root_cause(fmt::format(
          "rank {} (local rank {}, pid {}) stopped by ddprun's hang "
          "watchdog: {}",
          root_cause_->id.global_rank, root_cause_->id.local_rank, root_cause_->pid, verdict));
    }
    processes_ = snapshot_processes();
    capture_running_stacks("");
    if (!request_dumps()) begin_stop(SIGTERM);
  }

  WorkerFailure failure_of(const Worker& w) const {
    WorkerFailure f;
    f.global_rank = w.id.global_rank;
    f.local_rank = w.id.local_rank;
    f.pid = w.pid;
    f.status = w.status;
    f.time = w.exit_time;
    f.host = spec_.host;
    const auto& tail = w.streams[1]->tail();
    f.stderr_tail.assign(tail.begin(), tail.end());
    f.error_file = w.error_file;
    f.error = read_error_file(w.error_file);
    f.stopped_by_launcher = w.exited_after_stop;
    f.kill = w.kill;
    if (&w == root_cause_ && !hang_.empty()) {
      f.kill.text = "stopped by ddprun's hang watchdog: " + hang_;
    }
    return f;
  }

  AttemptResult result() const {
    AttemptResult r;
    if (interrupt_signal_ != 0) {
      // Every worker checkpointed and asked to be requeued (SIGTERM of a preemption): say so.
      r.outcome = all_asked_requeue() ? AttemptOutcome::kRequeue : AttemptOutcome::kInterrupted;
      r.signal = interrupt_signal_;
      return r;
    }
    if (root_cause_ == nullptr && stop_requested_ && !all_succeeded()) {
      r.outcome = AttemptOutcome::kStopped;
      r.processes = processes_;
      r.flight_recorder_dir = dump_dir_;
      r.stacks = stacks_;
      r.stacks_file = stacks_file_;
      return r;
    }
    if (root_cause_ == nullptr) {
      // Every worker exited 0 or kRequeueExitStatus.
      r.outcome = any_asked_requeue() ? AttemptOutcome::kRequeue : AttemptOutcome::kSucceeded;
      return r;
    }
    r.outcome = AttemptOutcome::kFailed;
    r.root_cause = failure_of(*root_cause_);
    r.processes = processes_;
    r.flight_recorder_dir = dump_dir_;
    r.stacks = stacks_;
    r.stacks_file = stacks_file_;
    r.hang = hang_;
    for (const auto& w : workers_) {
      if (w.get() != root_cause_ && !w->status.success()) r.others.push_back(failure_of(*w));
    }
    return r;
  }

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
};

}  // namespace

AttemptResult run_attempt(const AttemptSpec& spec, SignalChannel& signals) {
  if (spec.world == nullptr || spec.run_dir == nullptr || spec.command.empty()) {
    throw Error("run_attempt: world, run directory and command are required");
  }
  AttemptRunner runner(spec, signals);
  return runner.run();
}

}  // namespace ddp::launcher
