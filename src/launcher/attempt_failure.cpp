// What an attempt gathers at its first failure (or hang), before it stops the other workers:
// their processes' states, their stacks, their flight recorder dumps; and the failure record.
#include "attempt_runner.hpp"

#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "ddp/launcher/stack_capture.hpp"
#include "ddp/launcher/stack_service.hpp"
#include "ddp/launcher/torch_progress.hpp"
#include "ddp/util/deadline.hpp"
#include "ddp/util/dump_signal.hpp"

namespace ddp::launcher::detail {

namespace {

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

}  // namespace

void AttemptRunner::on_worker_exit(Worker& w, int status, long peak_rss_kib) {
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

std::vector<RankProcess> AttemptRunner::snapshot_processes() const {
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

bool AttemptRunner::request_dumps() {
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

WorkerFailure AttemptRunner::failure_of(const Worker& w) const {
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

void AttemptRunner::capture_running_stacks(const std::string& headline) {
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
    stacks_ =
        capture_stacks(targets, spec_.host, spec_.stack_tools, deadline_after(spec_.stacks_limit));
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

bool AttemptRunner::dumps_written() const {
  return std::all_of(dump_waiting_.begin(), dump_waiting_.end(),
                     [&](int rank) { return has_flight_dump(dump_dir_, rank); }) &&
         std::all_of(torch_waiting_.begin(), torch_waiting_.end(), [&](int rank) {
           return file_exists(fmt::format("{}/torch_fr.rank{}.json", attempt_dir_, rank));
         });
}

}  // namespace ddp::launcher::detail
