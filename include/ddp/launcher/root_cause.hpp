#pragma once
// The report printed when a worker group fails for good: which rank failed first, where,
// how (exit code or signal name), when, the tail of its stderr and the message from its
// error file; then the other ranks that failed and the ranks ddprun stopped.

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launcher/error_file.hpp"
#include "ddp/launcher/kill_cause.hpp"
#include "ddp/launcher/process.hpp"

namespace ddp::launcher {

struct WorkerFailure {
  int global_rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  ExitStatus status;
  std::chrono::system_clock::time_point time;
  std::string host;
  std::vector<std::string> stderr_tail;
  std::string error_file;
  std::optional<ErrorFileMessage> error;
  // True when the worker ended after ddprun began stopping the group (a consequence of the
  // root cause, not a cause).
  bool stopped_by_launcher = false;
  // Why it was killed, when ddprun could tell (kill_cause.hpp): the out-of-memory killer, a
  // SIGKILL from outside, an out-of-memory kill of a child.
  KillExplanation kill;
};

struct FailureReport {
  std::string role;
  std::string run_id;
  int restart_count = 0;  // restarts used when the last attempt failed
  int max_restarts = 0;
  WorkerFailure root_cause;
  std::vector<WorkerFailure> others;
  // The running workers' stacks when ddprun stopped them, in one line (stacks.hpp's
  // stacks_summary), and the file holding all of them ("" none).
  std::string stacks_summary;
  std::string stacks_file;
  // Whether stacks_file outlives ddprun (--log-dir); a temporary run folder's is removed at
  // exit, so the report then says how to keep it instead of naming it.
  bool stacks_file_kept = true;
};

std::string format_failure_report(const FailureReport& report);

// One line for the restart notice: "rank 1 (local rank 1, pid 42) failed: exit code 3", or
// "rank 1 (local rank 1, pid 42) was killed by the kernel's out-of-memory killer (SIGKILL): ...".
std::string describe_failure(const WorkerFailure& failure);

}  // namespace ddp::launcher
