// Why an attempt's worker died: its memory cgroup's out-of-memory kill count and limit, and
// the kernel log's record of the OOM killer (kill_cause.hpp).
#include "attempt_runner.hpp"

#include <signal.h>

#include <algorithm>

namespace ddp::launcher::detail {

void AttemptRunner::note_memory_cgroup(Worker& w) {
  w.cgroup = memory_cgroup_of(w.pid);
  if (!w.cgroup || oom_kills_seen_.count(w.cgroup->dir) > 0) return;
  if (auto count = read_oom_kill_count(*w.cgroup)) oom_kills_seen_[w.cgroup->dir] = *count;
}

KillExplanation AttemptRunner::explain(const Worker& w) {
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

void AttemptRunner::read_kernel_log() {
  for (auto& r : kernel_log_.read_oom_kills()) oom_records_.push_back(std::move(r));
}

const OomKillRecord* AttemptRunner::kernel_log_names(pid_t pid) const {
  const OomKillRecord* found = nullptr;
  for (const auto& r : oom_records_) {
    if (r.pid != pid) continue;
    if (found == nullptr || r.text.rfind("oom-kill:", 0) != 0) found = &r;
  }
  return found;
}

}  // namespace ddp::launcher::detail
