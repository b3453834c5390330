// Stopping an attempt's workers and their adopted descendants (SIGTERM, the grace period,
// SIGKILL, giving up on processes stuck in the kernel) and reaping them.
#include "attempt_runner.hpp"

#include <fmt/format.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>

#include <cerrno>

#include "ddp/util/deadline.hpp"

namespace ddp::launcher::detail {

void AttemptRunner::begin_stop(int sig) {
  if (stopping()) return;
  retire_spare();
  phase_ = Phase::kStopping;
  kill_at_ = deadline_after(spec_.term_grace);
  if (sig != 0) forward(sig);
  forward(SIGCONT);
  terminate_adopted(sig == 0 ? SIGTERM : sig);
}

void AttemptRunner::terminate_adopted(int sig) {
  for (pid_t child : list_children(self_)) {
    if (is_worker(child) || termed_.count(child) > 0) continue;
    termed_.insert(child);
    ::kill(child, sig);
  }
}

bool AttemptRunner::is_worker(pid_t pid) const {
  for (const auto& w : workers_) {
    if (w->pid == pid && !w->exited) return true;
  }
  return false;
}

void AttemptRunner::begin_kill() {
  if (phase_ != Phase::kKilling) {
    phase_ = Phase::kKilling;
    give_up_at_ = deadline_after(spec_.kill_wait);
  }
  kill_everything();
}

void AttemptRunner::kill_everything() {
  retire_spare();
  for (auto& w : workers_) signal_process_group(w->pid, SIGKILL);
  for (pid_t child : list_children(self_)) {
    ::kill(child, SIGKILL);
    ::kill(-child, SIGKILL);  // its group, when it leads one (no-op otherwise)
  }
}

void AttemptRunner::on_clock() {
  watch_progress();
  auto now = Clock::now();
  if (phase_ == Phase::kDumping) {
    if (dumps_written() || now >= dump_until_) {
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

void AttemptRunner::reap() {
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
    if (spare_ && spare_->pid() == pid) {
      // It exited by itself (a retired one is no longer spare_): say why, once.
      notice(
          fmt::format("the warm spare (pid {}) ended: {}; a rank restarted in place starts "
                      "in a new process (--warm-spare off starts none)",
                      pid, spare_->exit_reason(status)));
      spare_.reset();
      spare_failed_ = true;
      continue;
    }
    for (auto& w : workers_) {
      if (w->pid == pid && !w->exited) on_worker_exit(*w, status, usage.ru_maxrss);
    }
  }
}

void AttemptRunner::notice_uninterruptible(const std::vector<pid_t>& pids) {
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

const Worker* AttemptRunner::worker_with_pid(pid_t pid) const {
  for (const auto& w : workers_) {
    if (w->pid == pid) return w.get();
  }
  return nullptr;
}

}  // namespace ddp::launcher::detail
