// rdzv_load: the rendezvous protocol spoken by N agents inside this one process (a thread and
// a store connection each, as N nodes would have), against the TCP store or etcd.
//
//   rdzv_load --store tcp --agents N [--hb-seconds D] [--shards K] [--idle-seconds S]
//             [--heartbeat H] [--standby]
//   rdzv_load --store etcd --etcd HOST:PORT[,...] --store-pid PID[,...] --agents N
//             [--hb-seconds D] [--shards K] [--idle-seconds S] [--heartbeat H] [--key-ttl T]
//
// --key-ttl T: etcd's --rdzv-conf key_ttl (the run's shared lease: every agent renews it every
// T/3 s; default ddprun's 30 s), reported as key_ttl_s.
// --shards K: the agents live in K child processes (N/K threads each), because one process may
// not hold the descriptors of thousands of etcd agents (18 each once watching; this machine's hard
// open-files limit is 20000 and cannot be raised). The children connect, then the coordinator
// releases every agent at once through a pipe per child and gathers each child's timestamps
// (steady clock: one clock for all processes), node ranks and heartbeat counts.
//
// tcp: a child process serves the TCP store (so its memory and descriptors are its own); with
// --standby it replicates every write to a standby store in another child, as ddprun's c10d
// store host does by default (docs/rendezvous.md: a write is answered once the standby
// acknowledged it), and the JSON line adds standby_rss_mb (and idle_standby_cpu_pct); etcd:
// the cluster at --etcd, whose server processes --store-pid names (for their memory, sockets
// and CPU; a cluster's members as a comma list, the store_* and idle_store_cpu_pct figures are
// then sums over them).
//
// Several etcd endpoints (a cluster): agent i's list is rotated to start at member i % M. An
// EtcdStore talks to the first member of its list (each of its connections, requests, watches
// and lease renewals, starts there and moves to the next member only when that one fails), so
// the agents, and their connections, are spread evenly over the members, as a production
// cluster's clients are (by DNS, a load balancer, or differently ordered lists).
// Phases, one JSON line at the end:
//   connect_s        every agent opened its store connection (etcd: and its lease)
//   round_s          all agents released at once -> the last one returned from next_round()
//                    with the same round of N nodes (round formation; the headline figure;
//                    also when a later phase fails, ok false; -1: no consistent round)
//   first_return_s   released -> the first agent returned (node 0 assembled the round)
//   store_rss_mb     the store process's resident memory after the round (store_rss_base_mb:
//                    before any agent connected)
//   store_connections  TCP sockets the store process holds after the round, less before
//   hb_rps           heartbeat writes per second the store absorbed while every agent wrote
//                    its heartbeat key in a loop for --hb-seconds (its capacity), and
//                    hb_rps_needed: what N agents need at the default 5 s heartbeat with the
//                    watcher's two calls per beat (a heartbeat write and a peer read)
// With --idle-seconds S, then (the job's steady state): every agent runs ddprun's own
// MembershipWatcher on its store (heartbeat H, default 5 s, the watchers' starts spread over
// one period as real agents' are), and after one period the store's load is measured for S s:
//   idle_calls_per_s     Store calls per second the watchers made (counted in the agents)
//   idle_requests_per_s  requests per second the store served: etcd's gRPC requests
//                        (grpc_server_started_total of its /metrics; a Store call on etcd
//                        may be several), the TCP store's = idle_calls_per_s (one request
//                        per call)
//   idle_store_writes_per_s  etcd: writes per second over the window (its revision's growth:
//                        each is a raft proposal with an fsync); -1 for the TCP store
//   idle_store_cpu_pct   the store process's CPU time over the window, % of one core
//   idle_round_ended     agents whose watcher ended the round (a peer missed its heartbeats:
//                        the store was too slow for the heartbeats); 0 when the store keeps up
// With several --store-pid processes (an etcd cluster), also, per member in --store-pid order:
//   member_rss_mb, member_connections, idle_member_cpu_pct   the figures above, per member;
//   idle_requests_per_s is then the sum over the members' /metrics (each counts the requests
//   its own clients sent), idle_store_writes_per_s the cluster's (one revision)
//   agents_priority      "idle" (SCHED_IDLE) or "nice K": the agents' scheduling priority (the
//                        shards inherit the coordinator's)
// Exit 1 (with the reason on stderr) when a round is inconsistent or an agent fails.

#include <curl/curl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "counting_store.hpp"
#include "ddp/rendezvous/etcd/etcd_store.hpp"
#include "ddp/rendezvous/membership_watcher.hpp"
#include "ddp/rendezvous/rendezvous.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/store/tcp_store_server.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
constexpr size_t kAgentStack = 256 * 1024;  // 10k agents: 2.5 GiB of address space, not 80
constexpr int kConnecting = 256;

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

struct Args {
  std::string store = "tcp";
  std::string etcd;
  std::vector<int> store_pids;  // the store's server processes (an etcd cluster: one per member)
  int agents = 1000;
  double hb_seconds = 3;
  int shards = 1;
  double idle_seconds = 0;
  double heartbeat_s = 5;
  double key_ttl_s = 0;  // etcd: --rdzv-conf key_ttl (0: ddprun's default)
  bool standby = false;  // tcp: the store replicates to a standby store
};

// VmRSS of `pid` in MiB; -1 when unreadable.
double rss_mb(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::atof(line.c_str() + 6) / 1024.0;
  }
  return -1;
}

// CPU seconds (user + system) `pid` has used; -1 when unreadable.
double cpu_seconds(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  // Fields after the command: state is field 3, utime 14 and stime 15.
  std::vector<std::string> fields;
  size_t pos = close + 2;
  while (pos < stat.size()) {
    size_t end = stat.find(' ', pos);
    fields.push_back(stat.substr(pos, end - pos));
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  if (fields.size() < 13) return -1;
  return (std::atof(fields[11].c_str()) + std::atof(fields[12].c_str())) /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
}

size_t append_body(char* data, size_t size, size_t n, void* out) {
  static_cast<std::string*>(out)->append(data, size * n);
  return size * n;
}

// gRPC requests etcd at `endpoint` has started (the sum of grpc_server_started_total in its
// /metrics); -1 when unreadable.
int64_t etcd_requests(const ddp::rdzv::Endpoint& endpoint) {
  CURL* h = curl_easy_init();
  if (h == nullptr) return -1;
  std::string body;
  std::string url = fmt::format("http://{}:{}/metrics", endpoint.host, endpoint.port);
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &append_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
  CURLcode rc = curl_easy_perform(h);
  curl_easy_cleanup(h);
  if (rc != CURLE_OK) return -1;
  int64_t total = 0;
  size_t pos = 0;
  const std::string name = "grpc_server_started_total{";
  while ((pos = body.find(name, pos)) != std::string::npos) {
    size_t end = body.find('\n', pos);
    size_t space = body.rfind(' ', end);
    total += std::atoll(body.c_str() + space + 1);
    pos = end;
  }
  return total;
}

// etcd's revision at `endpoint` (it grows by one with every write: a put, a txn that wrote, a
// lease revoked with keys); -1 when unreadable.
int64_t etcd_revision(const ddp::rdzv::Endpoint& endpoint) {
  CURL* h = curl_easy_init();
  if (h == nullptr) return -1;
  std::string body;
  const std::string url = fmt::format("http://{}:{}/v3/kv/range", endpoint.host, endpoint.port);
  const std::string request = R"({"key":"AA=="})";  // key "\0": absent, only the header
  curl_easy_setopt(h, CURLOPT_URL, url.c_str());
  curl_easy_setopt(h, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 30000L);
  curl_easy_setopt(h, CURLOPT_POSTFIELDS, request.c_str());
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &append_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &body);
  CURLcode rc = curl_easy_perform(h);
  curl_easy_cleanup(h);
  const std::string name = "\"revision\":\"";
  const size_t pos = body.find(name);
  if (rc != CURLE_OK || pos == std::string::npos) return -1;
  return std::atoll(body.c_str() + pos + name.size());
}

// Sockets among `pid`'s open files.
int socket_count(int pid) {
  int n = 0;
  std::error_code ec;
  for (const auto& e :
       std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec)) {
    std::error_code lec;
    auto target = std::filesystem::read_symlink(e.path(), lec);
    if (!lec && target.string().rfind("socket:", 0) == 0) ++n;
  }
  return n;
}

// `per_pid` of every store process, and their sum (-1 if one is unreadable).
template <class F>
auto over_pids(const std::vector<int>& pids, F per_pid) {
  using T = decltype(per_pid(0));
  std::vector<T> each;
  T sum = 0;
  for (int pid : pids) {
    each.push_back(per_pid(pid));
    sum = (sum < 0 || each.back() < 0) ? T(-1) : sum + each.back();
  }
  return std::make_pair(sum, each);
}

// A one-shot gate every agent thread waits at.
class Gate {
 public:
  void open() {
    std::lock_guard<std::mutex> l(m_);
    open_ = true;
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock<std::mutex> l(m_);
    cv_.wait(l, [&] { return open_; });
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool open_ = false;
};

struct Shared {
  Args args;
  std::string run_id;
  int first = 0;  // this process's agents are first .. first + count - 1
  int count = 0;
  ddp::rdzv::Endpoint endpoint;
  std::vector<ddp::rdzv::Endpoint> etcd_endpoints;
  Gate go_round, go_hb, go_idle, end_idle;
  std::atomic<int> connected{0}, returned{0}, failed{0};
  int connecting = 0;  // guarded by m
  std::atomic<bool> stop_hb{false};
  std::atomic<int64_t> beats{0};
  std::atomic<int> hb_done{0};
  std::atomic<int64_t> idle_calls{0};
  std::atomic<int> round_ended{0};  // watchers that reported a change in the idle phase
  std::mutex m;
  std::condition_variable cv;
  Clock::time_point first_return{}, last_return{};
  std::vector<ddp::rdzv::RoundInfo> rounds;
  std::string first_error;
};

struct AgentArg {
  Shared* shared;
  int index;
};

void note_failure(Shared& s, const std::string& what) {
  std::lock_guard<std::mutex> l(s.m);
  if (s.first_error.empty()) s.first_error = what;
  ++s.failed;
  s.cv.notify_all();
}

void* agent_main(void* p) {
  auto* a = static_cast<AgentArg*>(p);
  Shared& s = *a->shared;
  ddp::rdzv::RendezvousOptions o;
  o.backend = s.args.store == "tcp" ? ddp::rdzv::Backend::kC10d : ddp::rdzv::Backend::kEtcd;
  o.run_id = s.run_id;
  o.nodes = {s.args.agents, s.args.agents};
  o.endpoint = s.endpoint;
  o.endpoints = s.etcd_endpoints;
  // A cluster: this agent starts at member index % M (its EtcdStore talks to the first member
  // of its list and fails over along it).
  if (!o.endpoints.empty()) {
    std::rotate(o.endpoints.begin(), o.endpoints.begin() + a->index % o.endpoints.size(),
                o.endpoints.end());
  }
  o.hostname = "agent" + std::to_string(a->index);
  o.local_addr = "10.0.0.1";
  o.conf.join_timeout = 600s;
  o.conf.close_timeout = 300s;
  o.conf.read_timeout = 300s;
  o.conf.connect_timeout = 60s;
  if (s.args.key_ttl_s > 0) {
    o.conf.key_ttl = std::chrono::duration_cast<ddp::rdzv::Millis>(
        std::chrono::duration<double>(s.args.key_ttl_s));
  }
  o.pick_master_port = [] { return 29500; };
  std::shared_ptr<ddp::Store> store;
  // At most kConnecting agents open their connections at once: N nodes do not start in the
  // same millisecond, and one process's burst of 2N connects overflows a listen backlog.
  {
    std::unique_lock<std::mutex> l(s.m);
    s.cv.wait(l, [&] { return s.connecting < kConnecting; });
    ++s.connecting;
  }
  struct Done {
    Shared& s;
    ~Done() {
      std::lock_guard<std::mutex> l(s.m);
      --s.connecting;
      s.cv.notify_all();
    }
  };
  try {
    Done done{s};
    if (s.args.store == "tcp") {
      ddp::TcpStoreOptions t;
      t.host = s.endpoint.host;
      t.port = s.endpoint.port;
      t.connect_retry = 120s;
      t.timeout = 600s;
      store = std::make_shared<ddp::TcpStore>(t);
    } else {
      ddp::rdzv::EtcdStoreOptions eo = ddp::rdzv::etcd_store_options(o);
      // One loopback address per simulated node: the ports of one address would run out.
      eo.local_address = fmt::format("127.1.{}.{}", a->index / 250, a->index % 250 + 1);
      store = std::make_shared<ddp::rdzv::EtcdStore>(eo);
    }
    store->set_timeout(600s);
  } catch (const std::exception& e) {
    note_failure(s, std::string("connect: ") + e.what());
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> l(s.m);
    ++s.connected;
    s.cv.notify_all();
  }
  s.go_round.wait();
  try {
    ddp::rdzv::Rendezvous r(o, store);
    ddp::rdzv::RoundInfo info = r.next_round();
    auto now = Clock::now();
    std::lock_guard<std::mutex> l(s.m);
    if (s.returned == 0) s.first_return = now;
    s.last_return = std::max(s.last_return, now);
    s.rounds[a->index - s.first] = info;
    ++s.returned;
    s.cv.notify_all();
  } catch (const std::exception& e) {
    note_failure(s, std::string("next_round: ") + e.what());
    return nullptr;
  }
  s.go_hb.wait();
  std::string key = "load/hb/" + std::to_string(a->index);
  int64_t beat = 0;
  try {
    // --hb-seconds 0: no capacity phase (etcd refuses a closed loop of writes from thousands
    // of agents with "too many requests", which would end the run before the idle phase).
    while (s.args.hb_seconds > 0 && !s.stop_hb.load(std::memory_order_relaxed)) {
      store->set(key, std::to_string(++beat));
    }
  } catch (const std::exception& e) {
    note_failure(s, std::string("heartbeat: ") + e.what());
  }
  s.beats += beat;
  {
    std::lock_guard<std::mutex> l(s.m);
    ++s.hb_done;
    s.cv.notify_all();
  }
  s.go_idle.wait();
  if (s.args.idle_seconds <= 0) return nullptr;
  // Real agents start watching when their round returns, not in the same millisecond: the
  // starts are spread over one heartbeat period.
  const auto period = std::chrono::duration<double>(s.args.heartbeat_s);
  std::this_thread::sleep_for(period * ((a->index * 7919) % 1000) / 1000.0);
  try {
    ddp::rdzv::RendezvousOptions wo = o;
    wo.conf.heartbeat = std::chrono::duration_cast<ddp::rdzv::Millis>(period);
    ddp::rdzv::MembershipWatcher watcher(
        wo, s.rounds[a->index - s.first], rdzv_load::counting(store, s.idle_calls),
        [&s](const std::string& why) {
          if (s.round_ended.fetch_add(1) == 0) {
            std::fprintf(stderr, "rdzv_load: a watcher ended the round: %s\n", why.c_str());
          }
        });
    s.end_idle.wait();
    watcher.stop();
  } catch (const std::exception& e) {
    note_failure(s, std::string("watching: ") + e.what());
  }
  return nullptr;
}

int usage(const char* why) {
  std::fprintf(
      stderr,
      "rdzv_load: %s\nusage: rdzv_load --store tcp|etcd --agents N [--etcd "
      "HOST:PORT[,...] --store-pid PID[,...]] [--hb-seconds D] [--shards K] [--idle-seconds S] "
      "[--heartbeat H] [--standby]\n",
      why);
  return 2;
}

// What a shard tells the coordinator after the round.
struct RoundReport {
  int32_t failed = 0;
  int32_t count = 0;     // node ranks that follow
  int64_t first_ns = 0;  // steady clock
  int64_t last_ns = 0;
  int64_t generation = -1;  // -2: the shard's agents disagree
  int32_t wrong_size = 0;   // agents whose round did not have N nodes
};

int64_t ns(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

// The coordinator and each shard talk over a non-blocking socket pair, so every exchange is
// bounded by ddp's socket helpers: longer than a shard's own limits (connect 600 s, round
// 900 s), after which the shard has exited and said why.
constexpr auto kExchangeLimit = 1000s;

bool send_bytes(int fd, const void* data, size_t n) {
  try {
    ddp::net::write_all(fd, data, n, Clock::now() + kExchangeLimit, "the other rdzv_load process");
    return true;
  } catch (const ddp::Error&) {
    return false;
  }
}

bool receive_bytes(int fd, void* data, size_t n) {
  try {
    ddp::net::read_exact(fd, data, n, Clock::now() + kExchangeLimit, "the other rdzv_load process");
    return true;
  } catch (const ddp::Error&) {
    return false;
  }
}

// One shard: its agents as threads. Talks to the coordinator over `fd`:
//   -> 'C' every agent connected (or 'F': one failed)     <- 'G' release the round
//   -> RoundReport + node ranks                            <- 'H' heartbeat for hb_seconds
//   -> int64 heartbeat writes
//   (--idle-seconds) the idle phase at once: the watchers start, one period later the
//   shard's store calls are counted for idle_seconds
//   -> int64 store calls in the window, int32 watchers that ended the round
// Returns the exit status.
int run_shard(Shared& s, int fd) {
  s.rounds.resize(s.count);
  std::vector<AgentArg> agent_args(s.count);
  std::vector<pthread_t> threads(s.count);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, kAgentStack);
  // The membership watchers' std::threads too.
  (void)pthread_setattr_default_np(&attr);
  for (int i = 0; i < s.count; ++i) {
    agent_args[i] = {&s, s.first + i};
    if (pthread_create(&threads[i], &attr, agent_main, &agent_args[i]) != 0) {
      std::fprintf(stderr, "rdzv_load: could start only %d agent threads\n", i);
      ::_exit(1);
    }
  }
  auto wait_for = [&](auto done, std::chrono::seconds limit) {
    std::unique_lock<std::mutex> l(s.m);
    return s.cv.wait_for(l, limit, [&] { return done() || s.failed > 0; }) && s.failed == 0;
  };
  auto fail = [&] {
    std::fprintf(stderr, "rdzv_load: %d agents failed; first: %s\n", s.failed.load(),
                 s.first_error.empty() ? "(timed out)" : s.first_error.c_str());
    (void)send_bytes(fd, "F", 1);
    ::_exit(1);
  };
  if (!wait_for([&] { return s.connected == s.count; }, 600s)) fail();
  char cmd = 0;
  if (!send_bytes(fd, "C", 1) || !receive_bytes(fd, &cmd, 1) || cmd != 'G') ::_exit(1);
  s.go_round.open();
  if (!wait_for([&] { return s.returned == s.count; }, 900s)) fail();
  RoundReport report;
  report.count = s.count;
  report.first_ns = ns(s.first_return);
  report.last_ns = ns(s.last_return);
  report.generation = s.rounds[0].generation;
  std::vector<int32_t> ranks;
  for (const auto& r : s.rounds) {
    if (r.generation != report.generation) report.generation = -2;
    report.wrong_size += r.num_nodes != s.args.agents;
    ranks.push_back(r.node_rank);
  }
  if (!send_bytes(fd, &report, sizeof report) ||
      !send_bytes(fd, ranks.data(), ranks.size() * sizeof(int32_t)) ||
      !receive_bytes(fd, &cmd, 1) || cmd != 'H') {
    ::_exit(1);
  }
  s.go_hb.open();
  std::this_thread::sleep_for(std::chrono::duration<double>(s.args.hb_seconds));
  s.stop_hb = true;
  if (!wait_for([&] { return s.hb_done == s.count; }, 600s)) fail();
  const int64_t beats = s.beats.load();
  (void)send_bytes(fd, &beats, sizeof beats);
  s.go_idle.open();
  if (s.args.idle_seconds > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(s.args.heartbeat_s));
    const int64_t calls0 = s.idle_calls.load();
    std::this_thread::sleep_for(std::chrono::duration<double>(s.args.idle_seconds));
    const int64_t calls = s.idle_calls.load() - calls0;
    s.end_idle.open();
    for (int i = 0; i < s.count; ++i) pthread_join(threads[i], nullptr);
    const int32_t ended = s.round_ended.load();
    (void)send_bytes(fd, &calls, sizeof calls);
    (void)send_bytes(fd, &ended, sizeof ended);
  } else {
    for (int i = 0; i < s.count; ++i) pthread_join(threads[i], nullptr);
  }
  ::_exit(s.failed == 0 ? 0 : 1);
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--store") {
      args.store = value();
    } else if (a == "--agents") {
      args.agents = std::atoi(value().c_str());
    } else if (a == "--etcd") {
      args.etcd = value();
    } else if (a == "--store-pid") {
      const std::string list = value();
      for (size_t pos = 0; pos <= list.size();) {
        size_t comma = std::min(list.find(',', pos), list.size());
        args.store_pids.push_back(std::atoi(list.substr(pos, comma - pos).c_str()));
        pos = comma + 1;
      }
    } else if (a == "--hb-seconds") {
      args.hb_seconds = std::atof(value().c_str());
    } else if (a == "--shards") {
      args.shards = std::atoi(value().c_str());
    } else if (a == "--idle-seconds") {
      args.idle_seconds = std::atof(value().c_str());
    } else if (a == "--heartbeat") {
      args.heartbeat_s = std::atof(value().c_str());
    } else if (a == "--key-ttl") {
      args.key_ttl_s = std::atof(value().c_str());
    } else if (a == "--standby") {
      args.standby = true;
    } else {
      return usage(("unknown argument " + a).c_str());
    }
  }
  if (args.agents < 1) return usage("--agents must be at least 1");
  if (args.shards < 1 || args.shards > args.agents) return usage("--shards: 1 to N");
  if (args.heartbeat_s < 0.1) return usage("--heartbeat: at least 0.1 s");
  if (args.store != "tcp" && args.store != "etcd") return usage("--store is tcp or etcd");
  if (args.standby && args.store != "tcp") return usage("--standby is for --store tcp");
  if (args.key_ttl_s != 0 && (args.store != "etcd" || args.key_ttl_s < 3))
    return usage("--key-ttl is for --store etcd, at least 3 s");
  const bool pids_ok =
      !args.store_pids.empty() &&
      std::all_of(args.store_pids.begin(), args.store_pids.end(), [](int pid) { return pid > 0; });
  if (args.store == "etcd" && (args.etcd.empty() || !pids_ok)) {
    return usage("--store etcd needs --etcd and --store-pid");
  }
  // An etcd agent holds 18 descriptors once its watcher runs (4 connections; 7 curl multi
  // handles' socket pairs, its own 3 and the easy handles' internal ones): raise the hard limit
  // where allowed (root), then the soft one.
  rlimit many{262144, 262144};
  (void)::setrlimit(RLIMIT_NOFILE, &many);
  ddp::net::raise_fd_limit();
  ::signal(SIGPIPE, SIG_IGN);

  Shared proto;
  proto.args = args;
  proto.run_id = "load" + std::to_string(::getpid());
  pid_t store_child = -1;
  pid_t standby_child = -1;
  std::string standby_endpoint;
  // A store server in a child process of its own, serving until this process exits; returns
  // its port (0 when the child failed).
  auto serve_in_child = [](pid_t& child, bool standby, const std::string& replicate_to) {
    int p[2];
    if (::pipe(p) != 0) return uint16_t{0};
    child = ::fork();
    if (child == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::close(p[0]);
      ddp::TcpStoreServerOptions so;
      so.host = "127.0.0.1";
      so.port = 0;
      so.backlog = 4096;
      so.standby = standby;
      // Every simulated node connects from 127.0.0.1; real nodes have an address each.
      so.max_handshakes_per_address = so.max_handshakes;
      ddp::TcpStoreServer server(so);
      server.start();
      if (!replicate_to.empty()) server.replicate_to({replicate_to});
      uint16_t port = server.port();
      (void)!::write(p[1], &port, sizeof port);
      for (;;) ::pause();
    }
    ::close(p[1]);
    uint16_t port = 0;
    if (::read(p[0], &port, sizeof port) != sizeof port) port = 0;
    ::close(p[0]);
    return port;
  };
  if (args.standby) {
    const uint16_t port = serve_in_child(standby_child, /*standby=*/true, "");
    if (port == 0) return usage("standby store child failed");
    standby_endpoint = "127.0.0.1:" + std::to_string(port);
  }
  if (args.store == "tcp") {
    const uint16_t port = serve_in_child(store_child, /*standby=*/false, standby_endpoint);
    if (port == 0) return usage("store child failed");
    proto.endpoint = {"127.0.0.1", port};
    args.store_pids = {store_child};
  } else {
    proto.etcd_endpoints = ddp::rdzv::parse_endpoints(args.etcd, ddp::rdzv::kDefaultEtcdPort);
    proto.endpoint = proto.etcd_endpoints.front();
  }
  const auto base_rss = over_pids(args.store_pids, rss_mb);
  const auto base_sockets = over_pids(args.store_pids, socket_count);

  struct Child {
    pid_t pid = -1;
    int fd = -1;  // the coordinator's end of the socket pair to it
  };
  std::vector<Child> shards(args.shards);
  auto t0 = Clock::now();
  for (int k = 0; k < args.shards; ++k) {
    int pair[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
      return usage("socketpair failed");
    }
    ddp::net::set_nonblocking(pair[0]);
    ddp::net::set_nonblocking(pair[1]);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      ::close(pair[0]);
      Shared& s = *new Shared();  // lives until _exit
      s.args = proto.args;
      s.run_id = proto.run_id;
      s.endpoint = proto.endpoint;
      s.etcd_endpoints = proto.etcd_endpoints;
      s.first = static_cast<int>(static_cast<int64_t>(args.agents) * k / args.shards);
      s.count =
          static_cast<int>(static_cast<int64_t>(args.agents) * (k + 1) / args.shards) - s.first;
      return run_shard(s, pair[1]);
    }
    ::close(pair[1]);
    shards[k] = {pid, pair[0]};
  }
  auto stop = [&](const char* why) {
    std::fprintf(stderr, "rdzv_load: %s\n", why);
    for (auto& c : shards) ::kill(c.pid, SIGKILL);
    if (store_child > 0) ::kill(store_child, SIGKILL);
    std::printf(
        "{\"bench\":\"rdzv_load\",\"store\":\"%s\",\"agents\":%d,\"shards\":%d,"
        "\"ok\":false}\n",
        args.store.c_str(), args.agents, args.shards);
    std::fflush(stdout);
    ::_exit(1);
  };
  for (auto& c : shards) {
    char m = 0;
    if (!receive_bytes(c.fd, &m, 1) || m != 'C') stop("a shard failed to connect its agents");
  }
  auto t_connected = Clock::now();
  auto t_release = Clock::now();
  for (auto& c : shards) {
    if (!send_bytes(c.fd, "G", 1)) stop("a shard is gone");
  }
  int64_t first_ns = INT64_MAX, last_ns = 0;
  int64_t generation = -1;
  bool ok = true;
  std::vector<char> seen(args.agents, 0);
  for (auto& c : shards) {
    RoundReport r;
    if (!receive_bytes(c.fd, &r, sizeof r)) stop("a shard's agents failed in the round");
    std::vector<int32_t> ranks(r.count);
    if (!receive_bytes(c.fd, ranks.data(), ranks.size() * sizeof(int32_t))) stop("a shard is gone");
    first_ns = std::min(first_ns, r.first_ns);
    last_ns = std::max(last_ns, r.last_ns);
    if (r.generation < 0 || (generation >= 0 && r.generation != generation) || r.wrong_size > 0) {
      ok = false;
    }
    generation = r.generation;
    for (int32_t rank : ranks) {
      if (rank < 0 || rank >= args.agents || seen[rank]) {
        ok = false;
      } else {
        seen[rank] = 1;
      }
    }
  }
  if (!ok)
    std::fprintf(stderr, "rdzv_load: the agents do not agree on one round of %d nodes\n",
                 args.agents);
  const auto round_rss = over_pids(args.store_pids, rss_mb);
  auto round_sockets = over_pids(args.store_pids, socket_count);
  round_sockets.first -= base_sockets.first;
  for (size_t m = 0; m < args.store_pids.size(); ++m) {
    round_sockets.second[m] -= base_sockets.second[m];
  }
  const bool round_ok = ok;  // the round's figures stand even if a later phase fails
  const auto hb0 = Clock::now();
  for (auto& c : shards) {
    if (!send_bytes(c.fd, "H", 1)) stop("a shard is gone");
  }
  int64_t beats = 0;
  for (auto& c : shards) {
    int64_t b = 0;
    if (!receive_bytes(c.fd, &b, sizeof b)) stop("a shard's heartbeats failed");
    beats += b;
  }
  const double hb_rps = static_cast<double>(beats) / seconds(Clock::now() - hb0);
  // The idle phase: the window starts one heartbeat period after the shards started their
  // watchers (they start it at the same moment, having sent their beats).
  std::string idle_json;
  std::vector<double> member_cpu_pct;
  // etcd: the gRPC requests every member served (each counts its own clients').
  auto all_requests = [&] {
    int64_t sum = 0;
    for (const auto& e : proto.etcd_endpoints) {
      const int64_t n = etcd_requests(e);
      sum = (sum < 0 || n < 0) ? -1 : sum + n;
    }
    return sum;
  };
  double standby_cpu_pct = -1;
  if (args.idle_seconds > 0) {
    std::this_thread::sleep_for(std::chrono::duration<double>(args.heartbeat_s));
    const double standby_cpu0 = standby_child > 0 ? cpu_seconds(standby_child) : 0;
    const auto cpu0 = over_pids(args.store_pids, cpu_seconds);
    const int64_t requests0 = args.store == "etcd" ? all_requests() : 0;
    const int64_t revision0 = args.store == "etcd" ? etcd_revision(proto.endpoint) : -1;
    const auto w0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(args.idle_seconds));
    const double window = seconds(Clock::now() - w0);
    const auto cpu1 = over_pids(args.store_pids, cpu_seconds);
    const double cpu = cpu1.first - cpu0.first;
    if (standby_child > 0) {
      standby_cpu_pct = 100.0 * (cpu_seconds(standby_child) - standby_cpu0) / window;
    }
    for (size_t m = 0; m < args.store_pids.size(); ++m) {
      member_cpu_pct.push_back(100.0 * (cpu1.second[m] - cpu0.second[m]) / window);
    }
    const int64_t requests = args.store == "etcd" ? all_requests() - requests0 : 0;
    const int64_t revision1 = args.store == "etcd" ? etcd_revision(proto.endpoint) : -1;
    const double writes_per_s = revision0 >= 0 && revision1 >= 0
                                    ? static_cast<double>(revision1 - revision0) / window
                                    : -1.0;
    int64_t calls = 0;
    int32_t ended = 0;
    for (auto& c : shards) {
      int64_t n = 0;
      int32_t e = 0;
      if (!receive_bytes(c.fd, &n, sizeof n) || !receive_bytes(c.fd, &e, sizeof e)) {
        stop("a shard's idle phase failed");
      }
      calls += n;
      ended += e;
    }
    const double calls_per_s = static_cast<double>(calls) / args.idle_seconds;
    idle_json = fmt::format(
        ",\"idle_s\":{:.0f},\"heartbeat_s\":{:.1f},\"idle_calls_per_s\":{:.0f},"
        "\"idle_requests_per_s\":{:.0f},\"idle_store_writes_per_s\":{:.1f},"
        "\"idle_store_cpu_pct\":{:.1f},\"idle_round_ended\":{}",
        args.idle_seconds, args.heartbeat_s, calls_per_s,
        args.store == "etcd" ? static_cast<double>(requests) / window : calls_per_s, writes_per_s,
        100.0 * cpu / window, ended);
    ok = ok && ended == 0;
  }
  for (auto& c : shards) {
    int status = 0;
    ::waitpid(c.pid, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  // A cluster: the figures of each member too.
  std::string members_json;
  if (args.store_pids.size() > 1) {
    members_json =
        fmt::format(",\"store_members\":{},\"member_rss_mb\":[{:.1f}],\"member_connections\":[{}]",
                    args.store_pids.size(), fmt::join(round_rss.second, ","),
                    fmt::join(round_sockets.second, ","));
    if (!member_cpu_pct.empty()) {
      members_json +=
          fmt::format(",\"idle_member_cpu_pct\":[{:.1f}]", fmt::join(member_cpu_pct, ","));
    }
  }
  std::string standby_json = ",\"standby\":false";
  if (standby_child > 0) {
    standby_json =
        fmt::format(",\"standby\":true,\"standby_rss_mb\":{:.1f}", rss_mb(standby_child));
    if (standby_cpu_pct >= 0) {
      standby_json += fmt::format(",\"idle_standby_cpu_pct\":{:.1f}", standby_cpu_pct);
    }
  }
  members_json += standby_json;
  // The agents' scheduling priority (run_rdzv_load.sh's AGENTS_PRIORITY): a store sharing the
  // machine's cores gets them first when the agents run niced or as SCHED_IDLE, as one on
  // machines of its own would.
  errno = 0;
  const int nice_value = ::getpriority(PRIO_PROCESS, 0);
  const bool sched_idle = ::sched_getscheduler(0) == SCHED_IDLE;
  if (args.store == "etcd") {
    members_json += fmt::format(",\"key_ttl_s\":{:.0f}",
                                args.key_ttl_s > 0
                                    ? args.key_ttl_s
                                    : ddp::rdzv::RendezvousConf::kDefaultKeyTtl.count() / 1000.0);
  }
  members_json += sched_idle   ? std::string(",\"agents_priority\":\"idle\"")
                  : errno == 0 ? fmt::format(",\"agents_priority\":\"nice {}\"", nice_value)
                               : std::string();
  const auto release_ns = ns(t_release);
  std::printf(
      "{\"bench\":\"rdzv_load\",\"store\":\"%s\",\"agents\":%d,\"shards\":%d,\"connect_s\":%.3f,"
      "\"round_s\":%.3f,\"first_return_s\":%.3f,\"store_rss_base_mb\":%.1f,\"store_rss_mb\":%.1f,"
      "\"store_connections\":%d,\"hb_rps\":%.0f,\"hb_rps_needed\":%.0f%s%s,\"ok\":%s}\n",
      args.store.c_str(), args.agents, args.shards, seconds(t_connected - t0),
      round_ok ? (last_ns - release_ns) / 1e9 : -1.0,
      round_ok ? (first_ns - release_ns) / 1e9 : -1.0, base_rss.first, round_rss.first,
      round_sockets.first, hb_rps, 2.0 * args.agents / 5.0, members_json.c_str(), idle_json.c_str(),
      ok ? "true" : "false");
  std::fflush(stdout);
  if (store_child > 0) ::kill(store_child, SIGKILL);
  if (standby_child > 0) ::kill(standby_child, SIGKILL);
  return ok ? 0 : 1;
}
