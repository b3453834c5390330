#pragma once
// The one process on a node allowed to ptrace its workers: a helper the agent starts
// (ddprun's own executable, internal command `__stack-tracer`) that runs the stack tools.
//
// Why a helper: with Yama's ptrace_scope 1 a process may be traced by its ancestors and by
// the tracer it declares (PR_SET_PTRACER) and that tracer's descendants. Workers that declared
// the agent could be traced by every descendant of the agent, each other worker included.
// Workers declare this helper instead: only the tools it starts can attach (issue 49, finding
// 11). The tools are its children, so the agent's wait4(-1) never reaps them and no pid of a
// tool is killed after it was reused.
//
// Contract:
// - start() spawns the helper with the checked tools (their open files are inherited: what
//   runs is what was checked); nullptr and `why` when it cannot.
// - capture() is capture_stacks() run in the helper: by `deadline`, never throws; every rank
//   gets stacks or an error (a helper that died or did not answer in time is named).
//   Thread-safe: one request at a time.
// - The helper dies with the agent (PR_SET_PDEATHSIG) and when its socket closes; it ignores
//   SIGINT, SIGTERM and SIGHUP so a stop of the job can still capture the workers' stacks.

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ddp/launcher/process.hpp"
#include "ddp/launcher/stack_capture.hpp"

namespace ddp::launcher {

class StackTracer {
 public:
  using Clock = std::chrono::steady_clock;

  // The internal command ddprun's main() dispatches to run_stack_tracer_process.
  static constexpr const char* kCommand = "__stack-tracer";

  // `tools` as find_stack_tools found them (their `tracer` is ignored).
  static std::shared_ptr<StackTracer> start(const StackTools& tools, std::string* why);
  ~StackTracer();
  StackTracer(const StackTracer&) = delete;
  StackTracer& operator=(const StackTracer&) = delete;

  pid_t pid() const { return pid_; }
  std::vector<RankStacks> capture(const std::vector<StackTarget>& targets, const std::string& host,
                                  Clock::time_point deadline);

 private:
  StackTracer(pid_t pid, UniqueFd pidfd, UniqueFd socket);
  // Every target with `error`.
  static std::vector<RankStacks> failed(const std::vector<StackTarget>& targets,
                                        const std::string& host, const std::string& error);

  pid_t pid_;
  UniqueFd pidfd_;  // signals reach the helper, never a process that reused its pid
  std::mutex mutex_;
  UniqueFd socket_;       // under mutex_; invalid once the helper is gone
  uint64_t next_id_ = 1;  // under mutex_
  std::string broken_;    // under mutex_: why the helper cannot be asked any more
};

// The helper's main (`ddprun __stack-tracer ...`): serves capture requests on its socket until
// it closes. Returns the exit code.
int run_stack_tracer_process(const std::vector<std::string>& args);

}  // namespace ddp::launcher
