#include "ddp/launcher/stack_tracer.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ddp/util/error.hpp"

namespace ddp::launcher {

namespace {

using json = nlohmann::json;
using Clock = StackTracer::Clock;

// A frame on the socket: request id (8 bytes), length (4 bytes), then the text. Both sides
// are this executable, so host byte order.
constexpr size_t kHeaderBytes = 12;
// Answers carry the stacks of every rank of the node (py-spy JSON of many threads): generous,
// but a bound.
constexpr uint32_t kMaxFrame = 256u << 20;
// How long the agent waits for the helper's hello at start.
constexpr std::chrono::milliseconds kStartLimit{5000};
// Past the capture's deadline, the helper still encodes and sends the answer.
constexpr std::chrono::milliseconds kAnswerMargin{2000};

// Writes all of `bytes` by `deadline`; false when the peer is gone or the time is up.
bool send_all(int fd, const std::string& bytes, Clock::time_point deadline) {
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n =
        ::send(fd, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      continue;
    }
    return false;
  }
  return true;
}

// Reads exactly `n` bytes by `deadline` (Clock::time_point::max(): no limit); false on EOF,
// an error or the deadline.
bool recv_exact(int fd, char* into, size_t n, Clock::time_point deadline) {
  size_t done = 0;
  while (done < n) {
    if (deadline != Clock::time_point::max()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
      if (left <= 0) return false;
      pollfd p{fd, POLLIN, 0};
      const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      if (r < 0 && errno != EINTR) return false;
      if (r <= 0) continue;
    }
    const ssize_t got = ::recv(fd, into + done, n - done, 0);
    if (got > 0) {
      done += static_cast<size_t>(got);
      continue;
    }
    if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    return false;
  }
  return true;
}

std::string frame(uint64_t id, const std::string& text) {
  std::string out(kHeaderBytes, '\0');
  const auto size = static_cast<uint32_t>(text.size());
  std::memcpy(out.data(), &id, 8);
  std::memcpy(out.data() + 8, &size, 4);
  return out + text;
}

// One frame by `deadline`; false on EOF, an error, an oversized frame or the deadline.
bool read_frame(int fd, uint64_t& id, std::string& text, Clock::time_point deadline) {
  char header[kHeaderBytes];
  if (!recv_exact(fd, header, kHeaderBytes, deadline)) return false;
  uint32_t size = 0;
  std::memcpy(&id, header, 8);
  std::memcpy(&size, header + 8, 4);
  if (size > kMaxFrame) return false;
  text.assign(size, '\0');
  return recv_exact(fd, text.data(), size, deadline);
}

int pidfd_open(pid_t pid) {
  return static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
}

void pidfd_kill(int pidfd, int sig) {
  if (pidfd >= 0) ::syscall(SYS_pidfd_send_signal, pidfd, sig, nullptr, 0);
}

}  // namespace

std::shared_ptr<StackTracer> StackTracer::start(const StackTools& tools, std::string* why) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    *why = fmt::format("cannot create its socket: {}", std::strerror(errno));
    return nullptr;
  }
  UniqueFd mine(pair[0]), theirs(pair[1]);
  const int py_spy_fd =
      tools.py_spy_file && tools.py_spy_file->valid() ? tools.py_spy_file->get() : -1;
  const int eu_stack_fd =
      tools.eu_stack_file && tools.eu_stack_file->valid() ? tools.eu_stack_file->get() : -1;
  const std::vector<std::string> argv = {"ddprun",
                                         kCommand,
                                         std::to_string(theirs.get()),
                                         tools.py_spy,
                                         std::to_string(py_spy_fd),
                                         tools.eu_stack,
                                         std::to_string(eu_stack_fd)};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  // dup2 onto itself clears close-on-exec: the helper inherits exactly these.
  for (int fd : {theirs.get(), py_spy_fd, eu_stack_fd}) {
    if (fd >= 0) posix_spawn_file_actions_adddup2(&actions, fd, fd);
  }
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  // The helper forks once and its first process exits: it must not stay a child of this agent,
  // whose attempts end when it has no children left and which stops whatever it adopted. The
  // agent is a child subreaper; while it waits for that first process it is not, so the helper
  // goes to the subreaper above (or init).
  int subreaper = 0;
  ::prctl(PR_GET_CHILD_SUBREAPER, &subreaper);
  if (subreaper != 0) ::prctl(PR_SET_CHILD_SUBREAPER, 0);
  pid_t first = -1;
  // This executable (ddprun), whatever path started it.
  const int rc = spawn_with_default_signals(&first, "/proc/self/exe", &actions, argv);
  posix_spawn_file_actions_destroy(&actions);
  theirs.reset();
  bool reaped = false;
  if (rc == 0) {
    const auto until = Clock::now() + kStartLimit;
    while (!(reaped = ::waitpid(first, nullptr, WNOHANG) == first) && Clock::now() < until) {
      ::usleep(1000);
    }
  }
  if (subreaper != 0) ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  if (rc != 0) {
    *why = fmt::format("cannot start it: {}", std::strerror(rc));
    return nullptr;
  }
  uint64_t id = 1;
  std::string hello;
  pid_t pid = -1;
  if (!read_frame(mine.get(), id, hello, Clock::now() + kStartLimit) || id != 0 ||
      std::sscanf(hello.c_str(), "ready %d", &pid) != 1 || pid <= 0) {
    if (!reaped) {  // not reaped: its pid is still its own
      ::kill(first, SIGKILL);
      ::waitpid(first, nullptr, 0);
    }
    *why = "it did not start (is this ddprun's own executable?)";
    return nullptr;
  }
  UniqueFd pidfd(pidfd_open(pid));
  return std::shared_ptr<StackTracer>(new StackTracer(pid, std::move(pidfd), std::move(mine)));
}

StackTracer::StackTracer(pid_t pid, UniqueFd pidfd, UniqueFd socket)
    : pid_(pid), pidfd_(std::move(pidfd)), socket_(std::move(socket)) {}

StackTracer::~StackTracer() {
  socket_.reset();  // the helper reads EOF and exits; its parent (not this agent) reaps it
  pidfd_kill(pidfd_.get(), SIGKILL);
}

std::vector<RankStacks> StackTracer::failed(const std::vector<StackTarget>& targets,
                                            const std::string& host, const std::string& error) {
  std::vector<RankStacks> out;
  for (const auto& t : targets) {
    RankStacks r;
    r.global_rank = t.global_rank;
    r.pid = t.pid;
    r.host = host;
    r.error = error;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<RankStacks> StackTracer::capture(const std::vector<StackTarget>& targets,
                                             const std::string& host, Clock::time_point deadline) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!broken_.empty()) return failed(targets, host, broken_);
  json request;
  request["host"] = host;
  request["budget_ms"] = std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
  json list = json::array();
  for (const auto& t : targets) list.push_back({t.global_rank, t.pid});
  request["targets"] = std::move(list);
  const uint64_t id = next_id_++;
  const auto until = deadline + kAnswerMargin;
  if (!send_all(socket_.get(), frame(id, request.dump()), until)) {
    broken_ =
        fmt::format("ddprun's stack tracer (pid {}) is gone; restart the job to read stacks", pid_);
    return failed(targets, host, broken_);
  }
  for (;;) {
    uint64_t got_id = 0;
    std::string text;
    if (!read_frame(socket_.get(), got_id, text, until)) {
      broken_ = fmt::format(
          "ddprun's stack tracer (pid {}) did not answer in time or is gone; restart the job to "
          "read stacks",
          pid_);
      pidfd_kill(pidfd_.get(), SIGKILL);
      return failed(targets, host, broken_);
    }
    if (got_id != id) continue;  // a late answer to an earlier request
    try {
      return decode_stacks(text);
    } catch (const std::exception& e) {
      return failed(targets, host, std::string("ddprun's stack tracer sent ") + e.what());
    }
  }
}

int run_stack_tracer_process(const std::vector<std::string>& args) {
  // args: socket fd, py-spy path, its fd, eu-stack path, its fd.
  if (args.size() != 5) return 2;
  // The job's stop (Ctrl-C, SIGTERM to the process group) must not end the tracer before the
  // agent's last capture; it ends when the agent's end closes its socket.
  ::signal(SIGINT, SIG_IGN);
  ::signal(SIGTERM, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);
  ::signal(SIGPIPE, SIG_IGN);
  // Not the agent's child (see StackTracer::start): the first process exits, the second serves.
  const pid_t second = ::fork();
  if (second < 0) return 1;
  if (second > 0) ::_exit(0);
  const int sock = std::stoi(args[0]);
  StackTools tools;
  tools.py_spy = args[1];
  tools.eu_stack = args[3];
  for (auto [fd_text, file] :
       {std::pair{args[2], &tools.py_spy_file}, std::pair{args[4], &tools.eu_stack_file}}) {
    const int fd = std::stoi(fd_text);
    if (fd < 0) continue;
    ::fcntl(fd, F_SETFD, FD_CLOEXEC);  // spawn_tool hands it to its tool only
    *file = std::make_shared<const UniqueFd>(fd);
  }
  ::fcntl(sock, F_SETFD, FD_CLOEXEC);
  if (!send_all(sock, frame(0, fmt::format("ready {}", ::getpid())), Clock::now() + kStartLimit)) {
    return 1;
  }
  for (;;) {
    uint64_t id = 0;
    std::string text;
    if (!read_frame(sock, id, text, Clock::time_point::max())) return 0;  // the agent is done
    std::vector<StackTarget> targets;
    std::string host;
    auto deadline = Clock::now();
    try {
      const json request = json::parse(text);
      host = request.at("host").get<std::string>();
      deadline += std::chrono::milliseconds(request.at("budget_ms").get<int64_t>());
      for (const auto& t : request.at("targets")) {
        targets.push_back({t.at(0).get<int>(), t.at(1).get<pid_t>()});
      }
    } catch (const std::exception&) {
      return 1;  // only the agent writes here: a garbled request means something is badly wrong
    }
    const std::string answer = encode_stacks(capture_stacks(targets, host, tools, deadline));
    if (!send_all(sock, frame(id, answer), Clock::now() + kAnswerMargin)) return 0;
  }
}

}  // namespace ddp::launcher
