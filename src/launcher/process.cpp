#include "ddp/launcher/process.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "ddp/util/error.hpp"

extern char** environ;

namespace ddp::launcher {

UniqueFd& UniqueFd::operator=(UniqueFd&& other) noexcept {
  if (this != &other) reset(other.release());
  return *this;
}

int UniqueFd::release() {
  int fd = fd_;
  fd_ = -1;
  return fd;
}

void UniqueFd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

namespace {

struct Pipe {
  UniqueFd read;
  UniqueFd write;
};

Pipe make_pipe(const std::string& what) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) {
    throw Error(
        fmt::format("cannot create a pipe for {}: {} (too many open files? raise "
                    "ulimit -n)",
                    what, std::strerror(errno)));
  }
  return Pipe{UniqueFd(fds[0]), UniqueFd(fds[1])};
}

void write_str(int fd, const char* s) {
  size_t n = std::strlen(s);
  while (n > 0) {
    ssize_t w = ::write(fd, s, n);
    if (w <= 0) {
      if (w < 0 && errno == EINTR) continue;
      return;
    }
    s += w;
    n -= static_cast<size_t>(w);
  }
}

// Runs in the child between fork and exec: async-signal-safe calls only.
[[noreturn]] void exec_child(pid_t parent, pid_t ptracer, int pdeath_signal, int out_fd, int err_fd,
                             char* const* argv, char* const* envp, const cpu_set_t* cpus,
                             int inherit_fd) {
  ::setpgid(0, 0);
  if (pdeath_signal > 0) {
    ::prctl(PR_SET_PDEATHSIG, pdeath_signal);
    // The launcher may have died before prctl took effect.
    if (::getppid() != parent) ::_exit(128 + pdeath_signal);
  }
  // Yama's ptrace_scope 1 lets only ancestors ptrace a process, or a tracer it declares and
  // that tracer's descendants. ddprun's workers declare its stack tracer, whose children are
  // the stack tools (py-spy, eu-stack), and not the agent: every descendant of the agent, the
  // other workers included, could trace them then. Kept across exec; EINVAL without Yama.
  if (ptracer >= 0) ::prctl(PR_SET_PTRACER, ptracer == 0 ? parent : ptracer, 0, 0, 0);
  ::dup2(out_fd, STDOUT_FILENO);
  ::dup2(err_fd, STDERR_FILENO);
  if (cpus != nullptr && ::sched_setaffinity(0, sizeof(cpu_set_t), cpus) != 0) {
    const int err = errno;
    write_str(STDERR_FILENO, "ddprun: cannot bind the worker to its CPUs (--numa-binding): ");
    write_str(STDERR_FILENO, std::strerror(err));
    write_str(STDERR_FILENO, "\n");
    ::_exit(127);
  }
  if (inherit_fd >= 0) ::fcntl(inherit_fd, F_SETFD, 0);
  ::signal(SIGPIPE, SIG_DFL);
  sigset_t empty;
  ::sigemptyset(&empty);
  ::sigprocmask(SIG_SETMASK, &empty, nullptr);
  ::execve(argv[0], argv, envp);
  int err = errno;
  write_str(STDERR_FILENO, "ddprun: cannot execute '");
  write_str(STDERR_FILENO, argv[0]);
  write_str(STDERR_FILENO, "': ");
  write_str(STDERR_FILENO, std::strerror(err));
  write_str(STDERR_FILENO, "\n");
  ::_exit(127);
}

}  // namespace

SpawnedProcess spawn_process(const SpawnOptions& options) {
  if (options.argv.empty()) throw Error("spawn_process: empty argv");
  const std::string& program = options.argv[0];

  // Everything the child needs is built before fork.
  std::vector<char*> argv;
  for (const auto& a : options.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::vector<char*> envp;
  for (const auto& e : options.env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);

  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : options.cpu_affinity) {
    if (c >= 0 && c < CPU_SETSIZE) CPU_SET(c, &cpus);
  }

  Pipe out = make_pipe(program);
  Pipe err = make_pipe(program);
  pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) {
    throw Error(fmt::format("cannot start '{}': fork failed: {} (process limit reached?)", program,
                            std::strerror(errno)));
  }
  if (pid == 0) {
    exec_child(parent, options.ptracer, options.pdeath_signal, out.write.get(), err.write.get(),
               argv.data(), envp.data(), options.cpu_affinity.empty() ? nullptr : &cpus,
               options.inherit_fd);
  }
  // Also set it here, so signals sent to -pid right after fork reach the child either way.
  ::setpgid(pid, pid);
  if (options.idle_class) {
    // From here, not in the child: whoever moves it back to the normal class later (a warm
    // spare taken at once) does so after this, never before. Best effort.
    sched_param param{};
    ::sched_setscheduler(pid, SCHED_IDLE, &param);
  }

  SpawnedProcess spawned;
  spawned.pid = pid;
  ::fcntl(out.read.get(), F_SETFL, O_NONBLOCK);
  ::fcntl(err.read.get(), F_SETFL, O_NONBLOCK);
  spawned.stdout_read = std::move(out.read);
  spawned.stderr_read = std::move(err.read);
  return spawned;
}

int spawn_with_default_signals(pid_t* pid, const std::string& path,
                               const posix_spawn_file_actions_t* actions,
                               const std::vector<std::string>& argv) {
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t empty, all;
  sigemptyset(&empty);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &empty);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const int rc = ::posix_spawn(pid, path.c_str(), actions, &attr, args.data(), environ);
  posix_spawnattr_destroy(&attr);
  return rc;
}

ExitStatus ExitStatus::from_wait_status(int status) {
  ExitStatus s;
  if (WIFSIGNALED(status)) {
    s.signaled = true;
    s.code = WTERMSIG(status);
  } else {
    s.code = WEXITSTATUS(status);
  }
  return s;
}

std::string ExitStatus::describe() const {
  if (signaled) return fmt::format("signal {} ({})", code, signal_name(code));
  return fmt::format("exit code {}", code);
}

std::string signal_name(int signo) {
  if (signo >= SIGRTMIN && signo <= SIGRTMAX) {
    return signo == SIGRTMIN ? "SIGRTMIN" : fmt::format("SIGRTMIN+{}", signo - SIGRTMIN);
  }
  const char* abbrev = ::sigabbrev_np(signo);
  if (abbrev == nullptr) return fmt::format("signal {}", signo);
  return std::string("SIG") + abbrev;
}

void signal_process_group(pid_t pgid, int signo) {
  if (pgid > 0) ::kill(-pgid, signo);
}

std::vector<pid_t> list_children(pid_t parent) {
  std::vector<pid_t> children;
  DIR* proc = ::opendir("/proc");
  if (proc == nullptr) return children;
  while (dirent* entry = ::readdir(proc)) {
    char* end = nullptr;
    long pid = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0') continue;
    char path[64];
    std::snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
    FILE* f = std::fopen(path, "r");
    if (f == nullptr) continue;
    char buf[512];
    size_t n = std::fread(buf, 1, sizeof(buf) - 1, f);
    std::fclose(f);
    buf[n] = '\0';
    // "pid (comm) state ppid ...": comm may hold spaces or ')', so parse after the last ')'.
    char* close = std::strrchr(buf, ')');
    if (close == nullptr) continue;
    char state = 0;
    long ppid = 0;
    if (std::sscanf(close + 1, " %c %ld", &state, &ppid) == 2 && ppid == parent) {
      children.push_back(static_cast<pid_t>(pid));
    }
  }
  ::closedir(proc);
  return children;
}

}  // namespace ddp::launcher
