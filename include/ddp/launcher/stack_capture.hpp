#pragma once
// Reads live processes' stacks with external tools: py-spy (`py-spy dump --json`, Python frames
// of a Python worker) and elfutils' eu-stack (native frames of any other worker, thread names
// from /proc/<pid>/task/<tid>/comm). Both attach with ptrace for a moment.
//
// Contract:
// - capture_stacks() runs one tool per process, all at once, and returns by `deadline` whatever
//   happens: a tool still running then is killed and its rank gets an error saying so. It never
//   throws; each rank gets either stacks or one error naming the cause and the fix (tool
//   missing, ptrace refused by kernel.yama.ptrace_scope or a container without CAP_SYS_PTRACE,
//   process gone).
// - The tools' exit statuses are not used (another thread of the caller may reap them: ddprun's
//   attempt loop reaps every child); their output alone decides.

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "ddp/launcher/process.hpp"

#include "ddp/launcher/stacks.hpp"

namespace ddp::launcher {

class StackTracer;

struct StackTools {
  std::string py_spy;    // "" when not found
  std::string eu_stack;  // "" when not found
  // The files that were checked, opened when they were found: what runs is that file (by
  // /proc/self/fd), whatever the path names by then (nullptr: none).
  std::shared_ptr<const UniqueFd> py_spy_file, eu_stack_file;
  // The helper that runs the tools (ddprun's agent starts one: stack_tracer.hpp); null: the
  // tools run as children of the caller.
  std::shared_ptr<StackTracer> tracer;
};

// $DDPRUN_PY_SPY / $DDPRUN_EU_STACK when set, else the first `py-spy` / `eu-stack` in an
// absolute folder of PATH or in `extra_dirs` (ddprun passes the directory of the workers'
// Python, where pip put py-spy). Every candidate, the variables' included, must pass
// untrusted_tool_reason; one that fails is skipped and named on stderr with the reason.
StackTools find_stack_tools(const std::vector<std::string>& extra_dirs = {});
// Why `path` must not be run with ptrace rights ("" when it may): ddprun runs the tool as its
// own user (root, often), so neither the file nor any folder above it (links resolved) may be
// another user's than root or this one, or writable by others (a sticky folder such as /tmp
// excepted: others cannot replace what is in it).
std::string untrusted_tool_reason(const std::string& path);

struct StackTarget {
  int global_rank = 0;
  pid_t pid = -1;
};

// Whether `pid` runs Python (its executable's name starts with "python", or it maps libpython).
bool is_python_process(pid_t pid);

// Why this process may not be allowed to ptrace others, with the fix; "" when nothing speaks
// against it (root, CAP_SYS_PTRACE, or ptrace_scope 0/1 for a parent or a declared tracer).
std::string ptrace_restriction();

std::vector<RankStacks> capture_stacks(const std::vector<StackTarget>& targets,
                                       const std::string& host, const StackTools& tools,
                                       std::chrono::steady_clock::time_point deadline);

}  // namespace ddp::launcher
