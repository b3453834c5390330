#include "ddp/launcher/stack_service.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>
#include <utility>

#include "ddp/launcher/output.hpp"
#include "ddp/launcher/process.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"
#include "local_trust.hpp"
#include "stack_requests.hpp"

namespace ddp::launcher {

namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
// How long the round thread waits for a request before it looks at its own queue again.
constexpr std::chrono::milliseconds kSlice{200};
constexpr std::chrono::milliseconds kClientSendLimit{2000};
// How long a client may take to read the answer once it is ready (the client reads as it
// arrives; one that does not must not hold the service).
constexpr std::chrono::milliseconds kClientReadLimit{5000};

// Writes all of `data` to the non-blocking socket `fd` by `deadline`; false when the peer went
// away or did not read in time.
bool write_until(int fd, const std::string& data, Clock::time_point deadline) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, static_cast<int>(left)) < 0 && errno != EINTR) return false;
  }
  return true;
}

// Joins a thread however the scope is left (a capture that throws must not leave it joinable,
// which would be std::terminate).
struct JoinOnExit {
  std::thread& t;
  ~JoinOnExit() {
    if (t.joinable()) t.join();
  }
};

// Creates `dir` 0700 if missing and checks it is this user's and not open to others: the socket
// inside hands out stack traces (and can pause the workers), so it must not be reachable by
// another user through a folder they made.
void ensure_private_dir(const std::string& dir) {
  if (::mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
    throw Error(fmt::format("cannot create {}: {} (set DDPRUN_RUNTIME_DIR to a writable folder)",
                            dir, std::strerror(errno)));
  }
  const std::string problem = detail::private_dir_problem(dir);
  if (!problem.empty()) {
    throw Error(
        fmt::format("{} is {}; remove it or set DDPRUN_RUNTIME_DIR to a folder only you can use",
                    dir, problem));
  }
}

// Through a temporary file of its own (mkstemp: created new, mode 600, never through a link
// someone placed under a fixed name), renamed over `path`.
void write_atomically(const std::string& path, const std::string& text) {
  std::string tmp = path + ".XXXXXX";
  UniqueFd fd(::mkstemp(tmp.data()));
  if (!fd.valid()) throw Error(fmt::format("cannot write {}: {}", tmp, std::strerror(errno)));
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = ::write(fd.get(), text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::unlink(tmp.c_str());
      throw Error(fmt::format("cannot write {}: {}", tmp, std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    throw Error(fmt::format("cannot write {}: {}", path, std::strerror(err)));
  }
}

std::string keys_prefix(const std::string& run_id, int generation) {
  return fmt::format("ddprun_stacks/{}/{}/", run_id, generation);
}

}  // namespace

std::string stacks_registry_dir() {
  std::string dir = env::get_or("DDPRUN_RUNTIME_DIR", "");
  if (!dir.empty()) return dir;
  const std::string xdg = env::get_or("XDG_RUNTIME_DIR", "");
  if (!xdg.empty()) return xdg + "/ddprun";
  return fmt::format("/tmp/ddprun-{}", ::geteuid());
}

struct StackService::State {
  StackServiceOptions options;
  std::string registry_dir, record_path, log_record_path, socket_path;
  UniqueFd listen_fd, stop_read, stop_write;
  std::thread socket_thread;

  std::mutex mutex;  // guards workers and the round fields below
  std::vector<StackTarget> workers;

  // The round (multi-node).
  std::shared_ptr<Store> store;
  int generation = -1, node_rank = 0, num_nodes = 1;
  // Why the other nodes of a multi-node round cannot be asked (no store: etcd, no token).
  std::string no_store_reason;
  std::thread round_thread;
  std::atomic<bool> round_stop{false};
  // Why the round's thread stopped before leave_round() (its store is gone), under mutex: a
  // request then names it at once instead of waiting out its deadline for no answer.
  std::string round_ended;
  int64_t reserved_id = 0;  // under mutex: reserve_request's id, until an ask uses it
  struct Outgoing {
    Clock::time_point deadline;
    int64_t reserved = 0;  // the id to ask with (0: a new one)
    bool done = false;
    std::vector<std::string> answers;  // per node rank ("" none)
  };
  std::deque<std::shared_ptr<Outgoing>> outgoing;
  std::condition_variable cv;

  // The last stack read of each worker process of the round (by pid). When another node's
  // worker fails, the round ends at once: this node captures its workers' stacks and stops
  // them, and the failing node's request may arrive after that. A worker that exited since is
  // then answered with where it was when this node stopped it, not "exited".
  std::map<int64_t, RankStacks> last_read;  // under mutex; cleared at join_round

  // One capture of the workers at a time. A process admits one tracer (eu-stack and py-spy
  // attach with ptrace), and when a round ends every node captures at once: this node for its
  // own report and, on the round thread, for the other nodes' requests. Two captures of the
  // same workers at the same moment made each other fail (a node's report then lacked the
  // other node's ranks, or some of its own). A capture asked for while another runs waits for
  // that one (until its own deadline) and takes its result: the same moment of the job.
  bool capturing = false;                // under mutex
  uint64_t captures_finished = 0;        // under mutex
  std::vector<RankStacks> last_capture;  // under mutex: the result of the last one
  Clock::time_point last_capture_at;     // under mutex: when it finished (reset: workers changed)
  std::condition_variable capture_done;

  // Another node's request: answered with the last capture when it is younger than
  // kRequestCaptureInterval. Every request pauses this node's workers (ptrace) once per
  // capture; a token holder asking in a loop pauses them at most once per interval.
  std::vector<RankStacks> capture_for_other_node(Clock::time_point deadline) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (captures_finished > 0 && !capturing &&
          Clock::now() - last_capture_at < StackService::kRequestCaptureInterval) {
        return last_capture;
      }
    }
    return capture(deadline);
  }

  std::vector<RankStacks> capture(Clock::time_point deadline) {
    std::vector<StackTarget> targets;
    {
      std::unique_lock<std::mutex> lock(mutex);
      if (capturing) {
        const uint64_t running = captures_finished;
        if (capture_done.wait_until(lock, deadline, [&] { return captures_finished != running; })) {
          return last_capture;
        }
        return last_reads_of(workers, "a capture of this node's workers still ran at the deadline");
      }
      capturing = true;
      targets = workers;
    }
    std::vector<RankStacks> got;
    try {
      got = capture_stacks(targets, options.host, options.tools, deadline);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      capturing = false;
      capture_done.notify_all();
      throw;
    }
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& r : got) {
      if (r.error.empty()) {
        last_read[r.pid] = r;
      } else if (auto it = last_read.find(r.pid); it != last_read.end()) {
        r = it->second;
      }
    }
    capturing = false;
    last_capture = got;
    last_capture_at = Clock::now();
    ++captures_finished;
    capture_done.notify_all();
    return got;
  }

  // What the last reads say of `targets` (under mutex); `why` for a worker never read.
  std::vector<RankStacks> last_reads_of(const std::vector<StackTarget>& targets,
                                        const std::string& why) {
    std::vector<RankStacks> out;
    for (const StackTarget& t : targets) {
      if (auto it = last_read.find(t.pid); it != last_read.end()) {
        out.push_back(it->second);
        continue;
      }
      RankStacks r;
      r.global_rank = t.global_rank;
      r.pid = t.pid;
      r.host = options.host;
      r.error = why;
      out.push_back(std::move(r));
    }
    return out;
  }

  // Asks the other nodes of the round; returns each node's answer ("" for none) by `deadline`.
  // When they cannot be asked (no store, or the round's thread stopped), `why` says why.
  std::vector<std::string> ask_other_nodes(Clock::time_point deadline, int& nodes,
                                           std::string& why) {
    auto request = std::make_shared<Outgoing>();
    request->deadline = deadline;
    std::unique_lock<std::mutex> lock(mutex);
    nodes = num_nodes;
    if (num_nodes <= 1) return {};
    if (!store || !round_ended.empty()) {
      why = !round_ended.empty()      ? "the other nodes cannot be asked: " + round_ended
            : no_store_reason.empty() ? "the other nodes cannot be asked (no store connection)"
                                      : no_store_reason;
      return {};
    }
    request->reserved = std::exchange(reserved_id, 0);
    outgoing.push_back(request);
    cv.notify_all();
    // The round thread finishes the ask at `deadline`, then collects the answers with a few
    // store calls: their time, which a loaded host stretches, is waited for too (a fixed 0.4 s
    // lost every answer of a CI run). The client's own deadline is later still.
    const auto budget = std::max(Clock::duration::zero(), deadline - Clock::now());
    if (!cv.wait_until(lock, deadline + kSlice * 2 + budget / 4, [&] { return request->done; })) {
      outgoing.erase(std::remove(outgoing.begin(), outgoing.end(), request), outgoing.end());
      why =
          "the other nodes' answers were not collected in time (this node's store connection "
          "is slow)";
    } else if (!round_ended.empty()) {
      why = "the other nodes cannot be asked: " + round_ended;
    }
    return request->answers;
  }

  // This node's workers' stacks and, with `all_nodes`, the other nodes' (asked through the
  // store while this node captures), by `deadline`; notes name the nodes not asked or silent.
  Collected collect(Clock::time_point deadline, bool all_nodes, double limit_s) {
    Collected got;
    std::vector<std::string> remote;
    std::string not_asked;
    std::thread asking;
    {
      JoinOnExit join{asking};
      if (all_nodes) {
        // The other nodes capture while this one does.
        asking = std::thread([&] { remote = ask_other_nodes(deadline, got.nodes, not_asked); });
      }
      got.stacks = capture(deadline);
    }
    if (!not_asked.empty()) got.notes.push_back(not_asked);
    int me = 0;
    {
      std::lock_guard<std::mutex> lock(mutex);
      me = node_rank;
    }
    got.answered.push_back(me);
    // Every other node is accounted for: answered, or named in a note.
    for (size_t n = 0; not_asked.empty() && n < static_cast<size_t>(got.nodes); ++n) {
      if (static_cast<int>(n) == me) continue;
      if (n >= remote.size() || remote[n].empty()) {
        got.notes.push_back(fmt::format("node rank {} did not answer within {:.1f} s", n, limit_s));
        continue;
      }
      try {
        for (auto& st : decode_stacks(remote[n])) got.stacks.push_back(std::move(st));
        got.answered.push_back(static_cast<int>(n));
      } catch (const std::exception& e) {
        got.notes.push_back(fmt::format("node rank {} sent an unreadable answer: {}", n, e.what()));
      }
    }
    return got;
  }

  void serve_client(int fd) {
    // One JSON line, bounded in time.
    std::string line;
    const auto until = Clock::now() + kClientSendLimit;
    while (line.find('\n') == std::string::npos) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      if (left <= 0) return;
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left)) <= 0) return;
      char buf[4096];
      const ssize_t n = ::read(fd, buf, sizeof(buf));
      if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
      if (n <= 0) return;
      line.append(buf, static_cast<size_t>(n));
      if (line.size() > 65536) return;
    }
    const json request = json::parse(line.substr(0, line.find('\n')), nullptr, false);
    int64_t timeout_ms = 10000;
    bool all_nodes = true;
    if (request.is_object()) {
      timeout_ms = request.value("timeout_ms", timeout_ms);
      all_nodes = request.value("all_nodes", true);
    }
    timeout_ms = std::clamp<int64_t>(timeout_ms, 100, kMaxCapture.count());
    // Captures finish a little before the client's deadline, so the answer arrives in time.
    const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms * 8 / 10);
    json answer;
    Collected got = collect(deadline, all_nodes, timeout_ms * 0.8 / 1000);
    json notes = json::array();
    for (auto& n : got.notes) notes.push_back(std::move(n));
    json answered = json::array();
    for (int n : got.answered) answered.push_back(n);
    std::vector<RankStacks>& stacks = got.stacks;
    const int nodes = got.nodes;
    answer["stacks"] = json::parse(encode_stacks(stacks));
    answer["nodes"] = nodes;
    answer["answered"] = answered;
    answer["notes"] = notes;
    answer["run_id"] = options.run_id;
    const std::string text = answer.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    if (!write_until(fd, text, Clock::now() + kClientReadLimit)) {
      detail::warn_stacks(
          fmt::format("a client did not take the answer ({} bytes) within {} s; dropped it",
                      text.size(), kClientReadLimit.count() / 1000));
    }
  }

  void socket_loop() {
    for (;;) {
      pollfd fds[2] = {{listen_fd.get(), POLLIN, 0}, {stop_read.get(), POLLIN, 0}};
      const int n = ::poll(fds, 2, 1000);
      if (n < 0 && errno != EINTR) return;
      if (fds[1].revents != 0) return;
      if (fds[0].revents == 0) continue;
      // Non-blocking: every read and write on it waits in poll() under a deadline.
      UniqueFd client(::accept4(listen_fd.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!client.valid()) continue;
      try {
        serve_client(client.get());
      } catch (const std::exception& e) {
        // A client that went away, a store that broke: the next request starts afresh.
        detail::warn_stacks(fmt::format("a request failed: {}", e.what()));
      }
    }
  }

  // Serves and asks the other nodes until leave_round(). A store call that times out (a
  // loaded host answering late) costs the request at hand, not the round: the next slice tries
  // again. Any other store error ends the thread (the store is gone), and says so to requests.
  // `prefix`: the round's keys; `first`: the first request to serve (join_round's read; 0: read
  // when the channel is made).
  void round_loop(std::shared_ptr<Store> s, const std::string& prefix, int me, int nodes,
                  int64_t first) {
    std::string ended;
    bool warned = false;
    try {
      std::optional<detail::StackRequestChannel> channel;
      while (!round_stop) {
        std::shared_ptr<Outgoing> mine;
        std::vector<std::string> answers;
        try {
          if (!channel) {
            channel.emplace(
                *s, prefix, me, nodes,
                [this](Clock::time_point d) { return capture_for_other_node(d); }, first);
          }
          {
            std::lock_guard<std::mutex> lock(mutex);
            if (!outgoing.empty()) {
              mine = outgoing.front();
              outgoing.pop_front();
            }
          }
          if (!mine) {
            channel->serve_for(kSlice);
            continue;
          }
          answers = channel->ask(mine->deadline, kSlice, mine->reserved);
        } catch (const TimeoutError& e) {
          if (!std::exchange(warned, true)) {
            detail::warn_stacks(
                fmt::format("the job's store answered late ({}); trying again", e.what()));
          }
        } catch (...) {
          // The round ends (below): a request taken from the queue goes back, so that its
          // asker hears why instead of waiting out its deadline.
          if (mine) {
            std::lock_guard<std::mutex> lock(mutex);
            outgoing.push_front(mine);
          }
          throw;
        }
        if (mine) {
          std::lock_guard<std::mutex> lock(mutex);
          mine->answers = std::move(answers);
          mine->done = true;
          cv.notify_all();
        }
      }
      int64_t unused = 0;
      {
        std::lock_guard<std::mutex> lock(mutex);
        unused = std::exchange(reserved_id, 0);
      }
      if (unused > 0) detail::StackRequestChannel::cancel_request(*s, prefix, unused);
      // The failing node's request (its id taken before the round ended) is answered first.
      if (channel) channel->drain(Clock::now() + kMaxCapture, kSlice);
    } catch (const Error& e) {
      // The store is gone (the round ended, its host exited): requests get no other nodes.
      ended = fmt::format("this node lost the job's store ({})", e.what());
    } catch (const std::exception& e) {
      ended = fmt::format("stack requests of other nodes are off for this round: {}", e.what());
      detail::warn_stacks(ended);
    }
    // Whoever waits for this thread's answers gets what there is.
    std::lock_guard<std::mutex> lock(mutex);
    if (!round_stop) round_ended = ended;
    for (auto& o : outgoing) o->done = true;
    outgoing.clear();
    cv.notify_all();
  }
};

StackService::StackService(StackServiceOptions options) : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.options = std::move(options);
  s.registry_dir = stacks_registry_dir();
  ensure_private_dir(s.registry_dir);
  const pid_t pid = ::getpid();
  s.socket_path = fmt::format("{}/{}.sock", s.registry_dir, pid);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (s.socket_path.size() >= sizeof(addr.sun_path)) {
    throw Error(
        fmt::format("the socket path {} is too long for a Unix socket; set "
                    "DDPRUN_RUNTIME_DIR to a shorter folder",
                    s.socket_path));
  }
  std::memcpy(addr.sun_path, s.socket_path.c_str(), s.socket_path.size() + 1);
  ::unlink(s.socket_path.c_str());  // a dead agent's with our pid
  s.listen_fd.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.listen_fd.valid() ||
      ::bind(s.listen_fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(s.listen_fd.get(), 8) != 0) {
    throw Error(fmt::format("cannot listen on {}: {}", s.socket_path, std::strerror(errno)));
  }
  json record = {{"format", "ddprun-agent"},
                 {"run_id", s.options.run_id},
                 {"host", s.options.host},
                 {"pid", pid},
                 {"socket", s.socket_path}};
  s.record_path = fmt::format("{}/{}.{}.json", s.registry_dir, s.options.run_id, pid);
  write_atomically(s.record_path, record.dump());
  if (!s.options.log_root.empty()) {
    s.log_record_path =
        fmt::format("{}/ddprun_agent.{}.{}.json", s.options.log_root, s.options.host, pid);
    try {
      write_atomically(s.log_record_path, record.dump());
    } catch (const Error&) {
      s.log_record_path.clear();  // the registry record is enough on this host
    }
  }
  int p[2];
  if (::pipe2(p, O_CLOEXEC) != 0) {
    throw Error(fmt::format("cannot create a pipe: {}", std::strerror(errno)));
  }
  s.stop_read.reset(p[0]);
  s.stop_write.reset(p[1]);
  s.socket_thread = std::thread([&s] { s.socket_loop(); });
}

StackService::~StackService() {
  State& s = *state_;
  leave_round();
  char byte = 1;
  (void)!::write(s.stop_write.get(), &byte, 1);
  if (s.socket_thread.joinable()) s.socket_thread.join();
  ::unlink(s.socket_path.c_str());
  ::unlink(s.record_path.c_str());
  if (!s.log_record_path.empty()) ::unlink(s.log_record_path.c_str());
}

void StackService::set_workers(std::vector<StackTarget> workers) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  state_->workers = std::move(workers);
  state_->last_capture_at = Clock::time_point{};  // the last capture was of other workers
}

std::vector<RankStacks> StackService::capture_local(Clock::time_point deadline) {
  return state_->capture(deadline);
}

StackService::Collected StackService::capture_all_nodes(Clock::time_point deadline) {
  const double limit_s = std::chrono::duration<double>(deadline - Clock::now()).count();
  return state_->collect(deadline, /*all_nodes=*/true, limit_s);
}

void StackService::join_round(std::shared_ptr<Store> store, int generation, int node_rank,
                              int num_nodes, std::string no_store_reason) {
  leave_round();
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    s.store = store;
    s.reserved_id = 0;
    s.last_read.clear();
    s.generation = generation;
    s.node_rank = node_rank;
    s.num_nodes = num_nodes;
    s.no_store_reason = std::move(no_store_reason);
    s.round_ended.clear();
  }
  if (!store) return;  // requests name the other nodes as not asked, and why
  // Where this node starts serving, read before join_round returns: a request posted after the
  // node joined is answered even when the round thread starts late. (Read in that thread, a
  // loaded machine let another node's first request come before it, which this node then took
  // for an earlier member's and never answered.) The store's limit is the channel's own. A
  // store that fails here leaves the read to the round thread, which retries a late store.
  const std::string prefix = keys_prefix(s.options.run_id, generation);
  int64_t first = 0;
  try {
    store->set_timeout(detail::StackRequestChannel::kAbandonedRequest);
    first = detail::StackRequestChannel::first_request(*store, prefix);
  } catch (const Error&) {
  }
  s.round_stop = false;
  s.round_thread = std::thread([&s, store, prefix, node_rank, num_nodes, first] {
    s.round_loop(store, prefix, node_rank, num_nodes, first);
  });
}

void StackService::reserve_request() {
  State& s = *state_;
  std::shared_ptr<Store> store;
  std::string prefix;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.store || s.num_nodes <= 1 || s.reserved_id != 0) return;
    store = s.store;
    prefix = keys_prefix(s.options.run_id, s.generation);
  }
  try {
    const int64_t id = detail::StackRequestChannel::reserve_request_id(*store, prefix);
    std::lock_guard<std::mutex> lock(s.mutex);
    s.reserved_id = id;
  } catch (const Error&) {
    // The store is gone: the report asks no other node anyway.
  }
}

void StackService::leave_round() {
  State& s = *state_;
  s.round_stop = true;
  if (s.round_thread.joinable()) s.round_thread.join();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.store.reset();
  s.node_rank = 0;
  s.num_nodes = 1;
  s.no_store_reason.clear();
  s.round_ended.clear();
}

const std::string& StackService::socket_path() const {
  return state_->socket_path;
}

}  // namespace ddp::launcher
