#include "ddp/launcher/kill_cause.hpp"

#include <fmt/format.h>
#include <signal.h>

#include <algorithm>
#include <fstream>

namespace ddp::launcher {

namespace {

std::string peak_rss_text(const KillEvidence& e) {
  if (e.peak_rss_kib < 0) return "its peak resident memory is unknown";
  return fmt::format("its peak resident memory was {}",
                     format_bytes(static_cast<uint64_t>(e.peak_rss_kib) * 1024));
}

bool counter_rose(const KillEvidence& e) {
  return e.oom_kills_before && e.oom_kills_now && *e.oom_kills_now > *e.oom_kills_before;
}

bool counter_known(const KillEvidence& e) {
  return e.oom_kills_before.has_value() && e.oom_kills_now.has_value();
}

std::string counter_text(const KillEvidence& e) {
  return fmt::format("cgroup oom_kill count {} -> {}", *e.oom_kills_before, *e.oom_kills_now);
}

std::string victims_text(const std::vector<int64_t>& pids) {
  std::string out;
  for (int64_t p : pids) out += (out.empty() ? "" : ", ") + std::to_string(p);
  return out;
}

// "cgroup X limit 256 MiB, peak 256 MiB. Give it more memory ..." or why that is unknown.
std::string limit_text(const KillEvidence& e) {
  if (e.limit_read && e.limit_bytes) {
    std::string out =
        fmt::format("cgroup {} limit {}", e.limit_cgroup, format_bytes(*e.limit_bytes));
    if (e.limit_peak_bytes) out += fmt::format(", peak {}", format_bytes(*e.limit_peak_bytes));
    return out +
           ". Give it more memory (the cgroup's memory limit / the job's --mem) or use less per "
           "rank.";
  }
  std::string where;
  if (e.limit_read) {
    where = fmt::format(
        "no memory limit applies to cgroup {} or its ancestors, so the machine as a whole ran out "
        "of memory",
        e.cgroup);
  } else if (!e.cgroup.empty()) {
    where = fmt::format("the memory limit of cgroup {} could not be read", e.cgroup);
  } else {
    where = "its memory cgroup is unknown";
  }
  return where +
         ". Give it more memory (the job's --mem, or fewer jobs on the machine) or use "
         "less per rank.";
}

std::string evidence_text(const KillEvidence& e) {
  std::string out;
  if (e.kernel_log_record) out = fmt::format("kernel log '{}'", *e.kernel_log_record);
  if (counter_rose(e)) out += (out.empty() ? "" : "; ") + counter_text(e);
  return out;
}

std::string not_oom_reason(const KillEvidence& e) {
  if (counter_rose(e) && e.kernel_log_read && !e.other_victims.empty()) {
    return fmt::format(
        "not the OOM killer: the kernel log names pid {} as its victim, not this worker",
        victims_text(e.other_victims));
  }
  if (counter_known(e)) return "not the OOM killer: the cgroup's oom_kill count did not change";
  if (e.kernel_log_read)
    return "not the OOM killer: the kernel log records no out-of-memory kill of it";
  return "the OOM killer cannot be ruled out: neither a cgroup oom_kill count nor the kernel log "
         "could be read";
}

}  // namespace

KillExplanation explain_exit(const ExitStatus& status, bool stopped_by_launcher,
                             const KillEvidence& e) {
  KillExplanation out;
  if (status.success()) return out;
  const bool sigkill = status.signaled && status.code == SIGKILL;
  // A rise of the counter is this worker's kill unless the kernel log, read through the death,
  // names other victims and not this one.
  const bool log_blames_others = e.kernel_log_read && !e.other_victims.empty();
  if (sigkill && (e.kernel_log_record || (counter_rose(e) && !log_blames_others))) {
    out.cause = KillCause::kOutOfMemory;
    out.consumed_oom_kill = counter_rose(e);
    out.text = fmt::format(
        "was killed by the kernel's out-of-memory killer (SIGKILL): {}; {} (evidence: {})",
        peak_rss_text(e), limit_text(e), evidence_text(e));
    return out;
  }
  if (stopped_by_launcher) return out;  // ddprun's own stop: the report lists it as such
  if (sigkill) {
    out.cause = KillCause::kSigkillFromOutside;
    const bool ruled_out = counter_known(e) || e.kernel_log_read;
    out.text = fmt::format("killed by SIGKILL from outside{} ({}); {}", ruled_out ? "" : " ddprun",
                           not_oom_reason(e), peak_rss_text(e));
    return out;
  }
  if (counter_rose(e)) {
    out.cause = KillCause::kChildOutOfMemory;
    out.consumed_oom_kill = true;
    std::string victims;
    if (!e.other_victims.empty()) {
      victims = fmt::format(": the kernel log names pid {}", victims_text(e.other_victims));
    }
    out.text = fmt::format(
        "the kernel's out-of-memory killer killed a process in its cgroup while it ran ({}{}; a "
        "child of it, such as a data loader worker?); {}",
        counter_text(e), victims, peak_rss_text(e));
  }
  return out;
}

std::string format_bytes(uint64_t bytes) {
  const double mib = static_cast<double>(bytes) / (1024.0 * 1024.0);
  if (mib >= 1024.0) return fmt::format("{:.1f} GiB", mib / 1024.0);
  if (mib >= 10.0) return fmt::format("{:.0f} MiB", mib);
  return fmt::format("{:.1f} MiB", mib);
}

char stat_state(const std::string& stat) {
  // "pid (comm) S ...": comm may hold spaces and parentheses, so the state follows the last ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size() || stat[close + 1] != ' ') return 0;
  return stat[close + 2];
}

std::string uninterruptible_text(const std::string& wchan) {
  const std::string where = wchan.empty() || wchan == "0" ? "" : ", in " + wchan;
  return fmt::format(
      "is in uninterruptible sleep (D state{}): it may not be killable, even by SIGKILL, until "
      "the kernel call returns (often a hung NFS or device)",
      where);
}

std::string describe_uninterruptible(int rank, int64_t pid, const std::string& wchan) {
  return fmt::format("rank {} (pid {}) {}", rank, pid, uninterruptible_text(wchan));
}

std::string read_wchan(int64_t pid) {
  std::ifstream in(fmt::format("/proc/{}/wchan", pid));
  std::string w;
  std::getline(in, w);
  return w == "0" ? "" : w;
}

}  // namespace ddp::launcher
