#include "ddp/launcher/warm_spare.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>

#include "ddp/launcher/worker_env.hpp"
#include "ddp/util/error.hpp"

namespace ddp::launcher {

namespace {

constexpr const char* kMagic = "ddp-warm-spare-1";

void append_field(std::string& out, const std::string& field) {
  out += field;
  out.push_back('\0');
}

template <typename T, typename F>
void append_list(std::string& out, const std::vector<T>& items, F&& text) {
  append_field(out, std::to_string(items.size()));
  for (const auto& item : items) append_field(out, text(item));
}

// The last non-empty line of what is left in `fd` (non-blocking), at most 64 KiB read.
std::string last_line_of(int fd) {
  std::string text;
  char buf[4096];
  while (text.size() < 65536) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  const size_t nl = text.rfind('\n');
  return nl == std::string::npos ? text : text.substr(nl + 1);
}

}  // namespace

std::vector<std::string> warm_spare_command(const std::vector<std::string>& worker_argv) {
  // worker_command (command.hpp) makes every Python worker `PYTHON -u ...`.
  if (worker_argv.size() < 3 || worker_argv[1] != "-u") return {};
  const std::string& next = worker_argv[2];
  const bool script = next.size() > 3 && next.compare(next.size() - 3, 3, ".py") == 0;
  if (!script && next != "-m" && next != "-c") return {};
  return {worker_argv[0], "-u", "-m", "ddp.warm_spare"};
}

std::string encode_warm_spare_message(const std::vector<std::string>& argv,
                                      const std::vector<std::string>& env,
                                      const std::vector<int>& cpus) {
  std::string out;
  append_field(out, kMagic);
  auto same = [](const std::string& s) { return s; };
  append_list(out, argv, same);
  append_list(out, env, same);
  append_list(out, cpus, [](int c) { return std::to_string(c); });
  return out;
}

bool can_leave_idle_class() {
  if (::geteuid() == 0) return true;  // CAP_SYS_NICE in the usual case
  rlimit limit{};
  if (::getrlimit(RLIMIT_NICE, &limit) != 0) return false;
  // Leaving SCHED_IDLE needs the right to run at nice 0: RLIMIT_NICE >= 20 - 0 (sched(7)).
  return limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= 20;
}

WarmSpare WarmSpare::start(SpawnOptions options) {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    throw Error(fmt::format("cannot create the warm spare's socket: {}", std::strerror(errno)));
  }
  UniqueFd mine(pair[0]);
  UniqueFd theirs(pair[1]);
  options.inherit_fd = theirs.get();
  set_env_entry(options.env, kWarmSpareFdEnvVar, std::to_string(theirs.get()));
  // Its own imports never from the working directory (Python >= 3.11; `-m` would put it first
  // on sys.path): the spare puts there what the program's Python would (warm_spare.py).
  set_env_entry(options.env, "PYTHONSAFEPATH", "1");
  WarmSpare spare;
  spare.idle_ = options.idle_class;
  spare.process_ = spawn_process(options);
  spare.socket_ = std::move(mine);
  return spare;
}

bool WarmSpare::warm() {
  char ready = 0;
  while (!warm_ && socket_.valid() && ::recv(socket_.get(), &ready, 1, MSG_DONTWAIT) == 1) {
    warm_ = ready == 'R';
  }
  return warm_;
}

void WarmSpare::leave_idle_class() {
  // Every thread: those its imports started are in the idle class too. Best effort: a thread
  // may end meanwhile, and the spare does the same for itself once it reads its orders.
  std::error_code ec;
  const std::string tasks = fmt::format("/proc/{}/task", process_.pid);
  for (const auto& entry : std::filesystem::directory_iterator(tasks, ec)) {
    const pid_t tid = static_cast<pid_t>(std::strtol(entry.path().filename().c_str(), nullptr, 10));
    if (tid <= 0 || ::sched_getscheduler(tid) != SCHED_IDLE) continue;
    sched_param param{};
    ::sched_setscheduler(tid, SCHED_OTHER, &param);
  }
}

std::optional<SpawnedProcess> WarmSpare::take(const SpawnOptions& worker, std::string& why) {
  // A spare still importing reads its orders only when its imports end: on a busy node, in the
  // idle class, that could be never. From now on it is the rank: normal priority.
  if (idle_ && !warm()) leave_idle_class();
  const std::string message =
      encode_warm_spare_message(worker.argv, worker.env, worker.cpu_affinity);
  const auto deadline = std::chrono::steady_clock::now() + kWarmSpareSendTimeout;
  size_t sent = 0;
  while (sent < message.size()) {
    const ssize_t n = ::send(socket_.get(), message.data() + sent, message.size() - sent,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        why = fmt::format("did not read its orders within {} ms", kWarmSpareSendTimeout.count());
        kill();
        return std::nullopt;
      }
      pollfd p{socket_.get(), POLLOUT, 0};
      const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
      if (ready == 0 || (ready < 0 && errno == EINTR) || (p.revents & POLLOUT) != 0) continue;
      why = "could not be reached (its socket was closed)";
      kill();
      return std::nullopt;
    }
    why = fmt::format("could not be reached ({})", std::strerror(errno));
    kill();
    return std::nullopt;
  }
  socket_.reset();  // end of file: the message is complete
  return std::move(process_);
}

void WarmSpare::kill() {
  signal_process_group(process_.pid, SIGKILL);
  socket_.reset();
}

std::string WarmSpare::exit_reason(int wait_status) {
  const std::string status = ExitStatus::from_wait_status(wait_status).describe();
  const std::string line =
      process_.stderr_read.valid() ? last_line_of(process_.stderr_read.get()) : "";
  return line.empty() ? status : fmt::format("{}: {}", status, line);
}

}  // namespace ddp::launcher
