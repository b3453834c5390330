#pragma once
// Starting and signalling worker processes.
//
// Contracts:
// - spawn_process forks and execs argv[0] (a path; resolve it first) with exactly `env`.
//   The child is the leader of its own process group (so a signal to -pid reaches everything
//   it starts, and a terminal's Ctrl-C reaches only the launcher, which forwards it), gets
//   PR_SET_PDEATHSIG so it dies when the launcher dies (even by SIGKILL), starts with an
//   empty signal mask and default SIGPIPE, and has its stdout/stderr connected to pipes whose
//   read ends (non-blocking, close-on-exec) are returned. stdin is inherited.
// - If exec fails the child writes "ddprun: cannot execute ..." to its stderr pipe and exits
//   127, so the failure is reported like any other worker failure.
// - The launcher must be single-threaded while it forks (only async-signal-safe calls run in
//   the child, but the parent prepares everything before fork).

#include <spawn.h>
#include <sys/types.h>

#include <string>
#include <vector>

namespace ddp::launcher {

// Owns a file descriptor. Movable, not copyable.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  ~UniqueFd() { reset(); }
  UniqueFd(UniqueFd&& other) noexcept : fd_(other.release()) {}
  UniqueFd& operator=(UniqueFd&& other) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release();
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct SpawnOptions {
  std::vector<std::string> argv;  // argv[0] is the executable's path
  std::vector<std::string> env;   // "KEY=VALUE"
  int pdeath_signal = 9;          // SIGKILL
  // CPUs the process may run on (sched_setaffinity before exec; its threads inherit them);
  // empty: those of the launcher.
  std::vector<int> cpu_affinity;
  // The process the child declares as its tracer (PR_SET_PTRACER, for Yama's ptrace_scope 1):
  // 0 the launcher, -1 none, else that pid (ddprun's stack tracer: stack_tracer.hpp).
  pid_t ptracer = 0;
  // A descriptor of the launcher's that the child keeps across exec (its close-on-exec flag is
  // cleared in the child only); -1 none.
  int inherit_fd = -1;
  // Start in the idle scheduling class (SCHED_IDLE): it runs only on CPU nobody else wants
  // (warm_spare.hpp; the child must be able to leave it again).
  bool idle_class = false;
};

struct SpawnedProcess {
  pid_t pid = -1;  // also its process group id
  UniqueFd stdout_read;
  UniqueFd stderr_read;
};

// Throws ddp::Error (naming the program and errno) when pipes or fork fail.
SpawnedProcess spawn_process(const SpawnOptions& options);

// posix_spawn of `path` with `argv` and this process's environment, every signal unblocked and
// at its default disposition in the child (ddprun blocks the signals it reads through a
// signalfd; a helper it runs must not inherit that). Returns posix_spawn's error (0: started).
int spawn_with_default_signals(pid_t* pid, const std::string& path,
                               const posix_spawn_file_actions_t* actions,
                               const std::vector<std::string>& argv);

// How a process ended, decoded from a wait status.
struct ExitStatus {
  bool signaled = false;
  int code = 0;  // exit code, or the signal number when signaled

  static ExitStatus from_wait_status(int status);
  bool success() const { return !signaled && code == 0; }
  // "exit code 3" or "signal 11 (SIGSEGV)"
  std::string describe() const;
};

// "SIGSEGV" for 11, "SIGRTMIN+3" style names for real-time signals, "signal N" otherwise.
std::string signal_name(int signo);

// Sends signo to process group pgid; a group that no longer exists is not an error.
void signal_process_group(pid_t pgid, int signo);

// The pids whose parent is `parent` (read from /proc/*/stat). Used to find descendants that
// were reparented to the launcher (a child subreaper) after their own parent exited.
std::vector<pid_t> list_children(pid_t parent);

}  // namespace ddp::launcher
