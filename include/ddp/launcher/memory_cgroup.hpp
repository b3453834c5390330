#pragma once
// A worker's memory cgroup: where it is and what its files say (the out-of-memory kill count,
// the memory limit and peak use), for explaining how a worker died (kill_cause.hpp).
//
// Both hierarchies are read: cgroup v2 (memory.events "oom_kill N", memory.max, memory.peak)
// and the v1 memory controller of hybrid machines (memory.oom_control "oom_kill N",
// memory.limit_in_bytes, memory.max_usage_in_bytes). The v1 controller wins
// when the process has one, since then v2 holds no memory files for it.
//
// Contracts: nothing here blocks (cgroup files are kernel-generated and answer at once) and
// nothing throws; a file that cannot be read is an absent value.

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>

namespace ddp::launcher {

struct MemoryCgroup {
  std::string dir;   // e.g. /sys/fs/cgroup/memory/slurm/job_7 (v1) or /sys/fs/cgroup/job_7 (v2)
  std::string root;  // the mount point of its hierarchy: ancestors are searched up to here
  int version = 0;   // 1 or 2
};

// Where the memory cgroup of a process is, from its /proc/<pid>/cgroup text and the
// /proc/self/mountinfo text; nullopt when no mounted hierarchy holds it.
std::optional<MemoryCgroup> resolve_memory_cgroup(const std::string& proc_pid_cgroup,
                                                  const std::string& mountinfo);

// The memory cgroup of a live process (reads /proc/<pid>/cgroup and /proc/self/mountinfo).
// For v2 the directory must hold memory.events (the memory controller is enabled there).
std::optional<MemoryCgroup> memory_cgroup_of(pid_t pid);

// "oom_kill N" from memory.events (v2) or memory.oom_control (v1); nullopt when absent.
std::optional<uint64_t> parse_oom_kill_count(const std::string& text);

// A count file: memory.peak, memory.max_usage_in_bytes, memory.failcnt; nullopt when the
// text is not a number.
std::optional<uint64_t> parse_byte_count(const std::string& text);

struct MemoryLimit {
  bool read = false;              // false: the file could not be read or parsed
  std::optional<uint64_t> bytes;  // nullopt: unlimited ("max", or v1's page-counter maximum)
};
// memory.max (v2) or memory.limit_in_bytes (v1).
MemoryLimit parse_memory_limit(const std::string& text);

// The counter of out-of-memory kills in the cgroup (not its descendants, for v1).
std::optional<uint64_t> read_oom_kill_count(const MemoryCgroup& cgroup);

// What limits a cgroup's memory: its own limit or, when it has none, the nearest ancestor's
// (up to the hierarchy's root), with that cgroup's peak use.
struct MemoryLimitInfo {
  std::string dir;                // the cgroup whose limit applies; "" when none applies
  bool read = false;              // false: no limit file could be read
  std::optional<uint64_t> bytes;  // nullopt: no limit anywhere up the tree
  std::optional<uint64_t> peak;   // memory.peak / memory.max_usage_in_bytes of `dir`
};
MemoryLimitInfo read_memory_limit(const MemoryCgroup& cgroup);

}  // namespace ddp::launcher
