#include "ddp/launcher/stack_capture.hpp"

#include "ddp/launcher/stack_tracer.hpp"
#include "ddp/util/env.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

namespace ddp::launcher {

namespace {

using Clock = std::chrono::steady_clock;

bool executable(const std::string& path) {
  return !path.empty() && ::access(path.c_str(), X_OK) == 0;
}

}  // namespace

std::string untrusted_tool_reason(const std::string& path) {
  char real[PATH_MAX];
  if (::realpath(path.c_str(), real) == nullptr) {
    return fmt::format("cannot resolve it ({})", std::strerror(errno));
  }
  // The file, then every folder above it up to /.
  for (std::string p = real;;) {
    struct stat st {};
    if (::stat(p.c_str(), &st) != 0)
      return fmt::format("cannot stat {} ({})", p, std::strerror(errno));
    const bool is_file = p == real;
    const std::string what = is_file ? "it" : "the folder " + p;
    if (st.st_uid != 0 && st.st_uid != ::geteuid()) {
      return fmt::format("{} belongs to uid {}, neither root nor this user", what, st.st_uid);
    }
    const bool sticky_dir = !is_file && (st.st_mode & S_ISVTX) != 0;
    if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0 && !sticky_dir) {
      return fmt::format("other users may write {} (mode {:o})", what, st.st_mode & 07777);
    }
    if (p == "/") return "";
    const size_t slash = p.rfind('/');
    p = slash == 0 ? "/" : p.substr(0, slash);
  }
}

namespace {

struct FoundTool {
  std::string path;
  std::shared_ptr<const UniqueFd> file;
};

// `candidate` opened, when it passes untrusted_tool_reason; otherwise nullptr, and the reason
// on stderr (`from` says where the candidate came from).
std::shared_ptr<const UniqueFd> open_trusted(const std::string& candidate,
                                             const std::string& from) {
  // Opened first, checked after, and the opened file compared with the checked one: what runs
  // later is this descriptor's file, so a rename after the check changes nothing.
  auto fd = std::make_shared<UniqueFd>(::open(candidate.c_str(), O_RDONLY | O_CLOEXEC));
  std::string why = fd->valid() ? untrusted_tool_reason(candidate)
                                : fmt::format("cannot open it ({})", std::strerror(errno));
  struct stat opened {
  }, checked{};
  if (why.empty() && (::fstat(fd->get(), &opened) != 0 ||
                      ::stat(candidate.c_str(), &checked) != 0 || opened.st_ino != checked.st_ino ||
                      opened.st_dev != checked.st_dev || !S_ISREG(opened.st_mode))) {
    why = "it changed while it was checked, or is not a regular file";
  }
  if (why.empty()) return fd;
  // ddprun runs the tool with the right to ptrace its workers (as root, often): one that
  // another user could have replaced is not used, and said so (once per lookup).
  std::fprintf(stderr, "ddprun: not using %s%s to read stacks: %s\n", candidate.c_str(),
               from.c_str(), why.c_str());
  return nullptr;
}

FoundTool find_tool(const char* env_name, const std::string& name,
                    const std::vector<std::string>& extra_dirs) {
  const std::string forced = env::get_or(env_name, "");
  if (!forced.empty()) {
    if (!executable(forced)) return {forced, nullptr};  // named when used: "cannot run ..."
    auto file = open_trusted(forced, fmt::format(" (${})", env_name));
    return file ? FoundTool{forced, file} : FoundTool{};
  }
  std::vector<std::string> dirs;
  const std::string path = env::get_or("PATH", "");
  for (size_t start = 0; start <= path.size();) {
    const size_t colon = path.find(':', start);
    dirs.push_back(
        path.substr(start, colon == std::string::npos ? std::string::npos : colon - start));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  dirs.insert(dirs.end(), extra_dirs.begin(), extra_dirs.end());
  for (const auto& d : dirs) {
    // A relative entry ("", ".", "bin") names whatever folder ddprun runs in: never searched.
    if (d.empty() || d[0] != '/' || !executable(d + "/" + name)) continue;
    const std::string candidate = d + "/" + name;
    if (auto file = open_trusted(candidate, "")) return {candidate, file};
  }
  return {};
}

std::string read_first_line(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  std::getline(in, text);
  return text;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n");
  if (a == std::string::npos) return "";
  const size_t b = s.find_last_not_of(" \t\r\n");
  return s.substr(a, b - a + 1);
}

// The tool's complaint in one line: its last non-empty stderr line.
std::string last_line(const std::string& text) {
  std::string last;
  size_t start = 0;
  while (start < text.size()) {
    size_t nl = text.find('\n', start);
    std::string line = trim(text.substr(start, nl == std::string::npos ? nl : nl - start));
    if (!line.empty()) last = line;
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return last.size() > 300 ? last.substr(0, 300) + "..." : last;
}

bool contains_any(const std::string& text, std::initializer_list<const char*> needles) {
  std::string lower = text;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  for (const char* n : needles) {
    if (lower.find(n) != std::string::npos) return true;
  }
  return false;
}

struct Job {
  StackTarget target;
  std::string tool_name;
  std::string note;  // appended to the tool name ("no py-spy: ...")
  pid_t child = -1;
  int out = -1, err = -1;
  std::string out_text, err_text;
  std::string error;  // set before spawning (tool missing) or after
};

// Runs argv; with `file` (the tool as it was checked, open), that file whatever argv[0] names now.
bool spawn_tool(Job& job, const std::vector<std::string>& argv, const UniqueFd* file) {
  // Non-blocking read ends: drain() reads until EAGAIN, which on a blocking pipe would be a
  // wait for the tool's exit, past the capture's deadline. pipe2 sets O_NONBLOCK on both ends;
  // the tool's write ends get it cleared below (a tool may not expect EAGAIN on stdout).
  int out_pipe[2], err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    job.error = fmt::format("cannot create a pipe: {}", std::strerror(errno));
    return false;
  }
  if (::pipe2(err_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    job.error = fmt::format("cannot create a pipe: {}", std::strerror(errno));
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return false;
  }
  for (int w : {out_pipe[1], err_pipe[1]}) {
    const int flags = ::fcntl(w, F_GETFL);
    if (flags >= 0) ::fcntl(w, F_SETFL, flags & ~O_NONBLOCK);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  std::string exec_path = argv[0];
  if (file != nullptr && file->valid()) {
    // dup2 onto itself clears close-on-exec in the child, so the kernel (and a script's
    // interpreter) can open /proc/self/fd/N during the exec.
    posix_spawn_file_actions_adddup2(&actions, file->get(), file->get());
    exec_path = fmt::format("/proc/self/fd/{}", file->get());
  }
  const int rc = spawn_with_default_signals(&job.child, exec_path, &actions, argv);
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  if (rc != 0) {
    ::close(out_pipe[0]);
    ::close(err_pipe[0]);
    job.child = -1;
    job.error = fmt::format("cannot run {}: {}", argv[0], std::strerror(rc));
    return false;
  }
  job.out = out_pipe[0];
  job.err = err_pipe[0];
  return true;
}

// A runaway tool's output is cut here.
constexpr size_t kMaxToolOutput = 64u << 20;

// Reads what is available from a non-blocking fd; closes it at EOF, on an error, or once
// kMaxToolOutput bytes were read (a runaway tool: enough; the tool then gets SIGPIPE or is
// killed at the deadline).
void drain(int& fd, std::string& into) {
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n > 0) {
      into.append(buf, static_cast<size_t>(n));
      if (into.size() >= kMaxToolOutput) {
        into.resize(kMaxToolOutput);
        break;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    break;
  }
  ::close(fd);
  fd = -1;
}

std::string ptrace_fix() {
  const std::string why = ptrace_restriction();
  return why.empty() ? "ptrace was refused (a container without CAP_SYS_PTRACE or a seccomp "
                       "profile that blocks ptrace: run it with --cap-add SYS_PTRACE; or the "
                       "process belongs to another user: run as that user or root)"
                     : "ptrace was refused: " + why;
}

void interpret(Job& job, const std::string& host, RankStacks& r) {
  r.tool = job.tool_name + job.note;
  if (!job.error.empty()) {
    r.error = job.error;
    return;
  }
  r.threads =
      job.tool_name == "py-spy" ? parse_py_spy_json(job.out_text) : parse_eu_stack(job.out_text);
  // ddprun's own progress thread (torch_progress.hpp) is not the program's.
  r.threads.erase(std::remove_if(r.threads.begin(), r.threads.end(),
                                 [](const ThreadStack& t) { return t.name == "ddprun-progress"; }),
                  r.threads.end());
  if (job.tool_name == "eu-stack") {
    for (auto& t : r.threads) {
      t.name = trim(read_first_line(fmt::format("/proc/{}/task/{}/comm", r.pid, t.tid)));
    }
  }
  if (!r.threads.empty()) return;
  const std::string said = last_line(job.err_text.empty() ? job.out_text : job.err_text);
  if (::kill(r.pid, 0) != 0 && errno == ESRCH) {
    r.error = "the process exited before its stack was read";
  } else if (contains_any(job.err_text, {"permission denied", "operation not permitted", "eperm",
                                         "elevated permissions"})) {
    r.error = fmt::format("{} on {}: {} ({} said: {})", job.tool_name, host, ptrace_fix(),
                          job.tool_name, said);
  } else {
    r.error = fmt::format("{} read no stack{}", job.tool_name,
                          said.empty() ? "" : fmt::format(" ({} said: {})", job.tool_name, said));
  }
}

}  // namespace

StackTools find_stack_tools(const std::vector<std::string>& extra_dirs) {
  StackTools t;
  FoundTool py_spy = find_tool("DDPRUN_PY_SPY", "py-spy", extra_dirs);
  FoundTool eu_stack = find_tool("DDPRUN_EU_STACK", "eu-stack", extra_dirs);
  t.py_spy = py_spy.path;
  t.py_spy_file = py_spy.file;
  t.eu_stack = eu_stack.path;
  t.eu_stack_file = eu_stack.file;
  return t;
}

bool is_python_process(pid_t pid) {
  char exe[4096] = {};
  const ssize_t n = ::readlink(fmt::format("/proc/{}/exe", pid).c_str(), exe, sizeof(exe) - 1);
  if (n > 0) {
    const std::string path(exe, static_cast<size_t>(n));
    const std::string base = path.substr(path.rfind('/') + 1);
    if (base.rfind("python", 0) == 0) return true;
  }
  std::ifstream maps(fmt::format("/proc/{}/maps", pid));
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find("/libpython3") != std::string::npos) return true;
  }
  return false;
}

std::string ptrace_restriction() {
  // CAP_SYS_PTRACE (bit 19 of the effective set) overrides every Yama mode but 3.
  std::ifstream status("/proc/self/status");
  std::string line;
  bool cap = false;
  while (std::getline(status, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      cap = ((std::strtoull(line.c_str() + 7, nullptr, 16) >> 19) & 1) != 0;
    }
  }
  const std::string scope = trim(read_first_line("/proc/sys/kernel/yama/ptrace_scope"));
  if (scope == "3") {
    return "/proc/sys/kernel/yama/ptrace_scope is 3 (no process may ptrace another until "
           "reboot); boot with a lower kernel.yama.ptrace_scope to read stacks";
  }
  if (cap) return "";
  if (scope == "2") {
    return "/proc/sys/kernel/yama/ptrace_scope is 2 (only CAP_SYS_PTRACE may ptrace); run as "
           "root, or lower it: sysctl -w kernel.yama.ptrace_scope=1";
  }
  if (scope == "1") {
    return "/proc/sys/kernel/yama/ptrace_scope is 1 (only a process's ancestors may ptrace it; "
           "ddprun's stack tracer is the one process its workers let trace them, so ask it with "
           "`ddprun stacks` "
           "rather than running py-spy yourself); run as root, or lower it: sysctl -w "
           "kernel.yama.ptrace_scope=0";
  }
  return "";
}

std::vector<RankStacks> capture_stacks(const std::vector<StackTarget>& targets,
                                       const std::string& host, const StackTools& tools,
                                       Clock::time_point deadline) {
  if (tools.tracer) return tools.tracer->capture(targets, host, deadline);
  std::vector<Job> jobs(targets.size());
  for (size_t i = 0; i < targets.size(); ++i) {
    Job& job = jobs[i];
    job.target = targets[i];
    const std::string pid = std::to_string(targets[i].pid);
    const bool python = is_python_process(targets[i].pid);
    if (python && !tools.py_spy.empty()) {
      job.tool_name = "py-spy";
      spawn_tool(job, {tools.py_spy, "dump", "--json", "--pid", pid}, tools.py_spy_file.get());
    } else if (!tools.eu_stack.empty()) {
      job.tool_name = "eu-stack";
      if (python) {
        job.note =
            " (native frames: no py-spy for the Python frames; pip install py-spy into the "
            "workers' Python, or set DDPRUN_PY_SPY)";
      }
      spawn_tool(job, {tools.eu_stack, "-p", pid}, tools.eu_stack_file.get());
    } else {
      job.tool_name = python ? "py-spy" : "eu-stack";
      job.error =
          python ? "no stack tool: py-spy not found (pip install py-spy==0.4.3 into the "
                   "workers' Python, as scripts/install-deps.sh does, or set DDPRUN_PY_SPY) and "
                   "no eu-stack for native frames (apt-get install elfutils)"
                 : "no stack tool: eu-stack not found (apt-get install elfutils, or set "
                   "DDPRUN_EU_STACK)";
    }
  }
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<std::pair<Job*, bool>> owners;  // (job, is stdout)
    for (auto& j : jobs) {
      if (j.out >= 0) {
        fds.push_back({j.out, POLLIN, 0});
        owners.emplace_back(&j, true);
      }
      if (j.err >= 0) {
        fds.push_back({j.err, POLLIN, 0});
        owners.emplace_back(&j, false);
      }
    }
    if (fds.empty()) break;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    const int n = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left, 1000)));
    if (n < 0 && errno != EINTR) break;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      Job& j = *owners[i].first;
      if (owners[i].second) {
        drain(j.out, j.out_text);
      } else {
        drain(j.err, j.err_text);
      }
    }
  }
  std::vector<RankStacks> out;
  for (auto& j : jobs) {
    RankStacks r;
    r.global_rank = j.target.global_rank;
    r.pid = j.target.pid;
    r.host = host;
    if (j.child > 0 &&
        (j.out_text.size() >= kMaxToolOutput || j.err_text.size() >= kMaxToolOutput)) {
      ::kill(j.child, SIGKILL);  // a runaway tool whose output was cut
    }
    if (j.out >= 0 || j.err >= 0) {
      // Past the deadline: a tool that hangs (a process in D state, a stopped tracer) must not
      // hold the report.
      if (j.child > 0) ::kill(j.child, SIGKILL);
      if (j.out >= 0) ::close(j.out);
      if (j.err >= 0) ::close(j.err);
      j.out = j.err = -1;
      j.error = fmt::format(
          "{} did not answer in time (the process may be in uninterruptible "
          "sleep, or the machine overloaded)",
          j.tool_name);
    }
    // Reap it unless another thread already did (ECHILD); it has closed its output, so it is
    // exiting, or it was just killed.
    if (j.child > 0) {
      for (int tries = 0; tries < 100; ++tries) {
        const pid_t w = ::waitpid(j.child, nullptr, WNOHANG);
        if (w != 0) break;
        ::usleep(1000);
      }
    }
    interpret(j, host, r);
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace ddp::launcher
