// run_attempt: the attempt's event loop (the workers' pipes, the signal channel, the stop
// request, the clock) and its outcome. The other parts of AttemptRunner: attempt_runner.hpp.
#include "ddp/launcher/worker_group.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>

#include "attempt_runner.hpp"
#include "ddp/util/error.hpp"

namespace ddp::launcher {

namespace detail {

AttemptRunner::AttemptRunner(const AttemptSpec& spec, SignalChannel& signals)
    : spec_(spec), signals_(signals), self_(::getpid()) {
  if (spec_.hang_timeout) watchdog_.emplace(*spec_.hang_timeout);
}

AttemptResult AttemptRunner::run() {
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

void AttemptRunner::notice(const std::string& text) {
  std::string line = "ddprun: " + text + "\n";
  write_fully(spec_.notice_fd, line.data(), line.size());
}

void AttemptRunner::loop() {
  for (;;) {
    if (all_exited()) {
      retire_spare();  // nobody left to replace
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
    if (n < 0 && errno != EINTR) throw Error(fmt::format("poll failed: {}", std::strerror(errno)));
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

int AttemptRunner::poll_timeout_ms() const {
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

bool AttemptRunner::read_stream(Worker& w, int s) {
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

void AttemptRunner::handle_signals() {
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

void AttemptRunner::forward(int sig) {
  for (auto& w : workers_) signal_process_group(w->pid, sig);
}

bool AttemptRunner::all_succeeded() const {
  return std::all_of(workers_.begin(), workers_.end(),
                     [](const auto& w) { return w->exited && w->status.success(); });
}

bool AttemptRunner::all_asked_requeue() const {
  return std::all_of(workers_.begin(), workers_.end(),
                     [](const auto& w) { return w->exited && asks_requeue(w->status); });
}

bool AttemptRunner::any_asked_requeue() const {
  return std::any_of(workers_.begin(), workers_.end(),
                     [](const auto& w) { return w->exited && asks_requeue(w->status); });
}

bool AttemptRunner::all_exited() const {
  return std::all_of(workers_.begin(), workers_.end(), [](const auto& w) { return w->exited; });
}

AttemptResult AttemptRunner::result() const {
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

}  // namespace detail

AttemptResult run_attempt(const AttemptSpec& spec, SignalChannel& signals) {
  if (spec.world == nullptr || spec.run_dir == nullptr || spec.command.empty()) {
    throw Error("run_attempt: world, run directory and command are required");
  }
  detail::AttemptRunner runner(spec, signals);
  return runner.run();
}

}  // namespace ddp::launcher
