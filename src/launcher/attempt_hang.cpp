// The hang watchdog within an attempt (--hang-timeout): its periodic check of the workers'
// progress records and, on its verdict, the stop of the attempt naming the rank behind.
#include "attempt_runner.hpp"

#include <fmt/format.h>

#include "ddp/launcher/torch_progress.hpp"

namespace ddp::launcher::detail {

void AttemptRunner::watch_progress() {
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
  auto verdict = watchdog_->observe(ranks, records, now, unix_us(std::chrono::system_clock::now()));
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

void AttemptRunner::on_hang(const std::string& verdict) {
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

}  // namespace ddp::launcher::detail
