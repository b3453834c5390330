#pragma once
// Kills explained: why a worker died by SIGKILL (the kernel's out-of-memory killer, or someone
// outside ddprun), and why a live worker does not die (uninterruptible sleep, D state).
//
// Pure functions of evidence gathered elsewhere (memory_cgroup.hpp, kernel_log.hpp, /proc, the
// wait4 rusage), so every message is testable without a real out-of-memory kill.
//
// Out of memory is claimed only on evidence: a kernel log record naming the worker's pid, or
// the oom_kill counter of the worker's memory cgroup having risen since the worker started (and
// no kernel log record naming another victim instead). Each counter increment explains one
// death at most.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launcher/process.hpp"

namespace ddp::launcher {

struct KillEvidence {
  int64_t peak_rss_kib = -1;  // wait4's ru_maxrss (KiB); < 0 unknown
  // The worker's memory cgroup ("" unknown) and its oom_kill counter: the level not yet
  // explained by another death (at least the value when the worker started), and now.
  std::string cgroup;
  std::optional<uint64_t> oom_kills_before;
  std::optional<uint64_t> oom_kills_now;
  // The limit that applies (memory_cgroup.hpp MemoryLimitInfo): limit_read false when unknown,
  // limit_bytes nullopt when there is none.
  bool limit_read = false;
  std::string limit_cgroup;
  std::optional<uint64_t> limit_bytes;
  std::optional<uint64_t> limit_peak_bytes;
  // The kernel log: whether it was read, the record naming this pid, other victims named.
  bool kernel_log_read = false;
  std::optional<std::string> kernel_log_record;
  std::vector<int64_t> other_victims;
};

enum class KillCause {
  kNone,                // nothing to add (not SIGKILL, or ddprun's own stop)
  kOutOfMemory,         // the out-of-memory killer ended the worker
  kSigkillFromOutside,  // SIGKILL that ddprun did not send, no out-of-memory evidence
  kChildOutOfMemory,    // the worker failed otherwise while an OOM kill hit its cgroup
};

struct KillExplanation {
  KillCause cause = KillCause::kNone;
  // kOutOfMemory: follows "rank R (local rank L, pid P) " ("was killed by the kernel's
  // out-of-memory killer (SIGKILL): ..."); otherwise follows "...: signal 9 (SIGKILL): ".
  std::string text;
  // Whether the counter increment was used up by this explanation.
  bool consumed_oom_kill = false;
};

// `stopped_by_launcher`: the worker ended after ddprun began stopping the group (its SIGKILL
// then may be ddprun's own).
KillExplanation explain_exit(const ExitStatus& status, bool stopped_by_launcher,
                             const KillEvidence& evidence);

// "812 MiB", "3.5 MiB", "1.5 GiB".
std::string format_bytes(uint64_t bytes);

// The state letter of a /proc/<pid>/stat line ('R', 'S', 'D', 'T', 'Z', ...); 0 when malformed.
char stat_state(const std::string& proc_pid_stat);

// "rank 2 (pid 99) is in uninterruptible sleep (D state, in nfs_wait_bit): it may not be
// killable, even by SIGKILL, until the kernel call returns (often a hung NFS or device)". /proc
// shows killable waits (vfork, many NFS waits) as D too, hence "may". `wchan` may be "" or "0".
std::string describe_uninterruptible(int rank, int64_t pid, const std::string& wchan);
// The same without the subject: "is in uninterruptible sleep (D state, in ...): ...".
std::string uninterruptible_text(const std::string& wchan);

// /proc/<pid>/wchan ("" when unreadable or not waiting).
std::string read_wchan(int64_t pid);

}  // namespace ddp::launcher
