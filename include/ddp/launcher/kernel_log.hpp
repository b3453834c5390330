#pragma once
// The kernel log's out-of-memory kill records (/dev/kmsg), as evidence that the kernel's
// out-of-memory killer ended a worker (kill_cause.hpp).
//
// The kernel writes, for each victim, "oom-kill:...,task=NAME,pid=PID,uid=UID" and
// "Out of memory: Killed process PID (NAME) ..." ("Memory cgroup out of memory: ..." when a
// cgroup limit was hit). /dev/kmsg is readable by root (or with CAP_SYSLOG, depending on
// kernel.dmesg_restrict); elsewhere the log is simply not used.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launcher/process.hpp"

namespace ddp::launcher {

struct OomKillRecord {
  int64_t pid = 0;
  std::string
      text;  // the message, cut after the process name: "Out of memory: Killed process 7 (x)"
};

// One /dev/kmsg record ("PRIO,SEQ,USEC,FLAGS;MESSAGE\n continuation lines") or a plain dmesg
// line; nullopt when it does not name an out-of-memory victim.
std::optional<OomKillRecord> parse_oom_kill_record(const std::string& record);

// Reads /dev/kmsg without ever blocking. Opened at the end of the log, so only records written
// afterwards are seen (one reader per attempt; the kernel keeps a position per open file).
class KernelLog {
 public:
  // Never throws: when the log cannot be opened, readable() is false.
  static KernelLog open_at_end(const std::string& path = "/dev/kmsg");

  bool readable() const { return fd_.valid(); }
  // Every out-of-memory victim recorded since the last call; reads what is there, never waits.
  std::vector<OomKillRecord> read_oom_kills();
  // Waits up to timeout_ms for a record not read yet (poll); false on timeout.
  bool wait_for_record(int timeout_ms) const;

 private:
  UniqueFd fd_;
};

}  // namespace ddp::launcher
