#include "ddp/launcher/stacks_command.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ddp/launcher/output.hpp"
#include "ddp/launcher/process.hpp"
#include "ddp/launcher/stack_service.hpp"
#include "ddp/launcher/stacks.hpp"
#include "ddp/util/error.hpp"
#include "local_trust.hpp"

namespace ddp::launcher {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

struct AgentRecord {
  std::string run_id, host, socket, file;
  int64_t pid = 0;
};

// An agent's record is a few hundred bytes; its answer holds every rank's stacks.
constexpr size_t kMaxRecordBytes = 64 << 10;
constexpr size_t kMaxAnswerBytes = size_t{128} << 20;

std::string host_name_or_empty() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "";
  return buf;
}

// Live agents' records among the *.json files of `dir` whose name starts with `prefix`. Only
// this user's regular files count, and only records of this user's running processes (a pid
// another user runs, EPERM, is no agent of ours); a file passed over for what it is goes to
// `ignored` with the reason.
std::vector<AgentRecord> records_in(const std::string& dir, const std::string& prefix,
                                    const std::string& run_id, std::vector<std::string>& ignored) {
  std::vector<AgentRecord> out;
  std::error_code ec;
  const std::string host = host_name_or_empty();
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) != 0 || e.path().extension() != ".json") continue;
    std::string why;
    const auto text = detail::read_own_file(e.path().string(), kMaxRecordBytes, why);
    if (!text) {
      ignored.push_back(fmt::format("{}: {}", e.path().string(), why));
      continue;
    }
    const json j = json::parse(*text, nullptr, false);
    if (!j.is_object() || j.value("format", "") != "ddprun-agent") continue;
    AgentRecord r;
    try {
      r.run_id = j.value("run_id", "");
      r.host = j.value("host", "");
      r.socket = j.value("socket", "");
      r.pid = j.value("pid", int64_t{0});
    } catch (const json::exception&) {
      ignored.push_back(fmt::format("{}: not an agent record", e.path().string()));
      continue;
    }
    r.file = e.path().string();
    if (!run_id.empty() && r.run_id != run_id) continue;
    if (!r.host.empty() && r.host != host) continue;  // a shared log folder: another node's
    if (r.pid <= 0 || r.pid > INT32_MAX || ::kill(static_cast<pid_t>(r.pid), 0) != 0) continue;
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<AgentRecord> find_agents(const StacksCommand& c, std::string& looked,
                                     std::vector<std::string>& ignored) {
  std::vector<AgentRecord> found;
  if (c.log_dir) {
    // DIR/<run id>, or DIR itself when it is the run folder.
    std::vector<std::string> dirs;
    if (!c.run_id.empty()) dirs.push_back(*c.log_dir + "/" + c.run_id);
    dirs.push_back(*c.log_dir);
    for (const auto& d : dirs) {
      looked += (looked.empty() ? "" : ", ") + d;
      for (auto& r : records_in(d, "ddprun_agent.", c.run_id, ignored)) {
        found.push_back(std::move(r));
      }
      if (!found.empty()) return found;
    }
  }
  const std::string registry = stacks_registry_dir();
  looked += (looked.empty() ? "" : ", ") + registry;
  if (c.run_id.empty()) return found;
  // The agents made it private; one that is not was made, or opened, by someone else.
  const std::string problem = detail::private_dir_problem(registry);
  if (!problem.empty() && ::access(registry.c_str(), F_OK) == 0) {
    throw UsageError(fmt::format(
        "ddprun stacks: {} is {}: another user may have made it, and its records cannot be "
        "trusted; remove it, or set DDPRUN_RUNTIME_DIR to a folder only you can use (the job's "
        "agents need the same)",
        registry, problem));
  }
  return records_in(registry, c.run_id + ".", c.run_id, ignored);
}

int64_t ms_left(Clock::time_point deadline) {
  return std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
}

TimeoutError no_answer(const AgentRecord& agent, double timeout_s) {
  return TimeoutError(
      fmt::format("the agent (pid {}) did not answer within {:.1f} s; pass a longer --timeout",
                  agent.pid, timeout_s));
}

// Connects the non-blocking `fd` by `deadline`: an agent whose listen queue is full (its
// service thread stuck) must not hold `ddprun stacks` past --timeout. Returns 0 or an errno.
int connect_until(int fd, const sockaddr_un& addr, Clock::time_point deadline) {
  for (;;) {
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) return 0;
    if (errno == EINTR) continue;
    if (errno == EAGAIN) {  // a Unix socket's full listen queue: try again shortly
      if (ms_left(deadline) <= 0) return ETIMEDOUT;
      ::usleep(20000);
      continue;
    }
    if (errno != EINPROGRESS) return errno;
    pollfd p{fd, POLLOUT, 0};
    const int n = ::poll(&p, 1, static_cast<int>(ms_left(deadline)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return ETIMEDOUT;
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
    return err;
  }
}

// One request, one answer, both bounded by `deadline`.
std::string ask(const AgentRecord& agent, double timeout_s, Clock::time_point deadline) {
  UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (!fd.valid() || agent.socket.size() >= sizeof(addr.sun_path)) {
    throw NetworkError(fmt::format("cannot open a socket for {}", agent.socket));
  }
  std::memcpy(addr.sun_path, agent.socket.c_str(), agent.socket.size() + 1);
  const int err = connect_until(fd.get(), addr, deadline);
  if (err == ETIMEDOUT) throw no_answer(agent, timeout_s);
  if (err != 0) {
    throw NetworkError(fmt::format(
        "cannot reach the agent (pid {}) at {}: {}{}", agent.pid, agent.socket, std::strerror(err),
        err == EACCES ? " (the job runs as another user: run ddprun stacks as that user)" : ""));
  }
  // The record named the socket; the kernel says who serves it.
  const std::string peer = detail::socket_peer_problem(fd.get(), static_cast<pid_t>(agent.pid));
  if (!peer.empty()) {
    throw NetworkError(
        fmt::format("the socket {} in {} is not that agent's: {}; remove the "
                    "record if the agent is gone",
                    agent.socket, agent.file, peer));
  }
  const std::string request =
      json{{"timeout_ms", static_cast<int64_t>(timeout_s * 1000)}, {"all_nodes", true}}.dump() +
      "\n";
  for (size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(fd.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      throw NetworkError(fmt::format("cannot send the request to the agent (pid {}): {}", agent.pid,
                                     std::strerror(errno)));
    }
    if (ms_left(deadline) <= 0) throw no_answer(agent, timeout_s);
    pollfd p{fd.get(), POLLOUT, 0};
    ::poll(&p, 1, static_cast<int>(ms_left(deadline)));
  }
  std::string answer;
  for (;;) {
    const int64_t left = ms_left(deadline);
    if (left <= 0) throw no_answer(agent, timeout_s);
    pollfd p{fd.get(), POLLIN, 0};
    const int n = ::poll(&p, 1, static_cast<int>(left));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[65536];
    const ssize_t got = ::read(fd.get(), buf, sizeof(buf));
    if (got < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
    if (got <= 0) break;
    answer.append(buf, static_cast<size_t>(got));
    if (answer.size() > kMaxAnswerBytes) {
      throw ProtocolError(
          fmt::format("the agent (pid {}) sent more than {} MiB; no answer of an "
                      "agent is that large",
                      agent.pid, kMaxAnswerBytes >> 20));
    }
  }
  return answer;
}

}  // namespace

int run_stacks_command(const StacksCommand& c) {
  std::string looked;
  std::vector<std::string> ignored;
  const std::vector<AgentRecord> agents = find_agents(c, looked, ignored);
  for (const auto& i : ignored) {
    std::fprintf(stderr, "ddprun stacks: ignored %s\n", detail::printable(i).c_str());
  }
  const std::string job = c.run_id.empty() ? *c.log_dir : "'" + c.run_id + "'";
  if (agents.empty()) {
    std::fprintf(stderr,
                 "ddprun stacks: no running ddprun agent of run %s on this host (looked in %s). "
                 "Run it on a node of the job, with the job's --run-id (and its --log-dir if it "
                 "used one, or the same DDPRUN_RUNTIME_DIR).\n",
                 job.c_str(), looked.c_str());
    return 2;
  }
  // Any agent of the job answers for every node (several agents share a host in tests).
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(c.timeout_s * 1000) + 1000);
  const std::string text = ask(agents.front(), c.timeout_s, deadline);
  const json answer = json::parse(text, nullptr, false);
  if (!answer.is_object() || !answer.contains("stacks")) {
    throw ProtocolError(fmt::format("the agent (pid {}) sent an unreadable answer ({} bytes)",
                                    agents.front().pid, text.size()));
  }
  const std::vector<RankStacks> stacks = decode_stacks(answer["stacks"].dump());
  int nodes = 1;
  size_t answered = 1;
  std::string run_id = c.run_id;
  try {
    nodes = answer.value("nodes", 1);
    answered = answer.contains("answered") ? answer["answered"].size() : 1;
    run_id = answer.value("run_id", c.run_id);
  } catch (const json::exception& e) {
    throw ProtocolError(fmt::format("the agent (pid {}) sent a malformed answer: {}",
                                    agents.front().pid, e.what()));
  }
  bool complete = answered == static_cast<size_t>(nodes);
  for (const auto& s : stacks) complete = complete && s.error.empty();
  if (c.json) {
    std::printf("%s\n", answer.dump(1).c_str());
  } else {
    // Frame names, files and notes come from the workers and other nodes: printed escaped.
    std::printf("ddprun stacks: run '%s', %zu ranks from %zu of %d nodes: %s\n",
                detail::printable(run_id).c_str(), stacks.size(), answered, nodes,
                stacks.empty() ? "no worker is running"
                               : detail::printable(stacks_summary(stacks)).c_str());
    for (const auto& line : format_folded(stacks)) {
      std::printf("%s\n", detail::printable(line).c_str());
    }
    if (answer.contains("notes")) {
      for (const auto& n : answer["notes"]) {
        if (n.is_string()) {
          std::printf("ddprun stacks: %s\n", detail::printable(n.get<std::string>()).c_str());
        }
      }
    }
  }
  std::fflush(stdout);
  return complete && !stacks.empty() ? 0 : 1;
}

}  // namespace ddp::launcher
