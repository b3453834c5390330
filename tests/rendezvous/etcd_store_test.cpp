// EtcdStore against a real etcd (started by the test on loopback): the Store contract, the
// shared lease, failover between members, the errors of an unreachable or non-etcd endpoint,
// and the rendezvous protocol (agents as threads) running over it unchanged.

#include <gtest/gtest.h>

#include <atomic>
#include <csignal>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>

#include "../support/throws_with.hpp"
#include "ddp/rendezvous/etcd/etcd_store.hpp"
#include "ddp/rendezvous/membership_watcher.hpp"
#include "ddp/rendezvous/rendezvous.hpp"
#include "ddp/util/socket.hpp"
#include "etcd_http.hpp"
#include "etcd_http_options.hpp"
#include "etcd_process.hpp"

namespace ddp::rdzv::test {
namespace {

using namespace std::chrono_literals;
using ddp::test::throws_with;

EtcdStoreOptions store_options(const EtcdProcess& etcd, const std::string& prefix) {
  EtcdStoreOptions o;
  o.endpoints = etcd.endpoints();
  o.prefix = prefix;
  o.connect_timeout = 3s;
  o.read_timeout = 10s;
  return o;
}

// A loopback port that refuses every connection and that no other test can take meanwhile: a
// socket bound to it that never listens.
struct RefusingPort {
  net::Socket socket{::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)};
  uint16_t port = 0;
  RefusingPort() {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(socket.fd(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        ::getsockname(socket.fd(), reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      throw NetworkError("cannot bind a loopback port for the test");
    }
    port = ntohs(a.sin_port);
  }
};

// A whole HTTP reply (the connection closed after it) carrying a JSON body.
std::string json_http_reply(const std::string& status, const std::string& body) {
  return fmt::format(
      "HTTP/1.1 {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
      "Connection: close\r\n\r\n{}",
      status, body.size(), body);
}

// A loopback HTTP server standing in for etcd: each connection's request (headers and a JSON
// body ending in '}', read with a 2 s bound) gets `respond(request)` as the whole reply, and
// the connection is closed only after the client did, so no unread byte turns the close into
// a reset.
class FakeHttpServer {
 public:
  explicit FakeHttpServer(std::function<std::string(const std::string&)> respond)
      : listener_(net::listen_tcp("127.0.0.1", 0, 16)),
        port_(static_cast<uint16_t>(net::local_port(listener_.fd()))),
        respond_(std::move(respond)),
        thread_([this] { serve(); }) {}
  ~FakeHttpServer() {
    stop_ = true;
    ::shutdown(listener_.fd(), SHUT_RDWR);
    thread_.join();
  }
  uint16_t port() const { return port_; }

 private:
  void serve() {
    while (!stop_) {
      // The listener may be non-blocking: wait for a connection (bounded, to see stop_).
      pollfd p{listener_.fd(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      int c = ::accept(listener_.fd(), nullptr, nullptr);
      if (c < 0) continue;
      int flags = ::fcntl(c, F_GETFL);
      ::fcntl(c, F_SETFL, flags & ~O_NONBLOCK);
      timeval tv{2, 0};
      ::setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      std::string request;
      char buf[4096];
      ssize_t n;
      while (request.find("\r\n\r\n") == std::string::npos || request.back() != '}') {
        if ((n = ::read(c, buf, sizeof buf)) <= 0) break;
        request.append(buf, static_cast<size_t>(n));
      }
      const std::string reply = respond_(request);
      (void)!::write(c, reply.data(), reply.size());
      ::shutdown(c, SHUT_WR);
      while (::read(c, buf, sizeof buf) > 0) {
      }
      ::close(c);
    }
  }

  net::Socket listener_;
  uint16_t port_;
  std::function<std::string(const std::string&)> respond_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST(EtcdStore, StoreContract) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd;
  EtcdStore s(store_options(etcd, "/t1/"));
  s.set_timeout(5s);
  s.set("a", std::string("x\0y\xff", 4));
  EXPECT_EQ(s.get("a"), std::string("x\0y\xff", 4));
  EXPECT_TRUE(s.check({"a"}));
  EXPECT_FALSE(s.check({"a", "b"}));
  EXPECT_EQ(s.add("n", 5), 5);
  EXPECT_EQ(s.add("n", 2), 7);
  EXPECT_EQ(s.add("n", 0), 7);
  EXPECT_EQ(std::stoll(s.get("n")), 7);
  EXPECT_EQ(s.multi_get({"n", "a"}).front(), "7");
  EXPECT_EQ(s.add("absent", 0), 0);
  s.set("plain", "12");
  EXPECT_EQ(s.add("plain", 0), 12);
  EXPECT_EQ(s.add("plain", 1), 13);  // an integer set() wrote counts on
  EXPECT_EQ(s.add("plain", 1), 14);
  EXPECT_EQ(s.get("plain"), "14");
  EXPECT_EQ(s.add("n", -1), 6);
  EXPECT_EQ(s.add("n", 1), 7);
  EXPECT_EQ(s.add("n", 1000), 1007);
  s.set("words", "not a number");
  EXPECT_TRUE(throws_with<ProtocolError>([&] { s.add("words", 1); },
                                         {"/t1/words", "not an integer counter"}));
  EXPECT_EQ(s.compare_set("c", "", "one"), "one");
  EXPECT_EQ(s.compare_set("c", "", "two"), "one");
  EXPECT_EQ(s.compare_set("c", "one", "two"), "two");
  EXPECT_EQ(s.compare_set("c", "zzz", "three"), "two");
  EXPECT_EQ(s.compare_set("missing", "zzz", "three"), "zzz");  // c10d's rule
  EXPECT_FALSE(s.check({"missing"}));
  s.multi_set({"m1", "m2"}, {"v1", "v2"});
  EXPECT_EQ(s.multi_get({"m2", "m1"}), (std::vector<std::string>{"v2", "v1"}));
  EXPECT_TRUE(s.delete_key("m1"));
  EXPECT_FALSE(s.delete_key("m1"));
  EXPECT_GE(s.num_keys(), 5);
  EXPECT_TRUE(throws_with<TimeoutError>(
      [&] {
        s.wait({"a", "never"}, 300ms);
      },
      {"waiting for 1 of 2 keys (never)", "/t1/"}));
}

TEST(EtcdStore, WaitWakesOnAPutFromAnotherClient) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd;
  EtcdStore waiter(store_options(etcd, "/t2/"));
  auto setter = std::async(std::launch::async, [&] {
    EtcdStore s(store_options(etcd, "/t2/"));
    std::this_thread::sleep_for(200ms);
    s.set("k1", "1");
    s.set("k2", "2");
  });
  waiter.set_timeout(30s);
  EXPECT_EQ(waiter.multi_get({"k1", "k2"}), (std::vector<std::string>{"1", "2"}));
  setter.get();
}

TEST(EtcdStore, AnInterruptedWaitEndsAtOnceOthersEndSetOrTimedOut) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd;
  EtcdStore waiter(store_options(etcd, "/t2i/"));
  WaitInterrupter interrupter;
  // Interrupted while its watch is open (60 s: a watch that ignored the interrupt would end
  // kTimedOut only after that).
  auto interrupt = std::async(std::launch::async, [&] {
    std::this_thread::sleep_for(300ms);
    interrupter.interrupt();
  });
  EXPECT_EQ(waiter.wait_interruptibly({"never"}, 60s, interrupter), WaitOutcome::kInterrupted);
  interrupt.get();
  // Sticky until cleared: a wait that starts now ends at once.
  EXPECT_EQ(waiter.wait_interruptibly({"never"}, 60s, interrupter), WaitOutcome::kInterrupted);
  interrupter.clear();
  EXPECT_EQ(waiter.wait_interruptibly({"never"}, 300ms, interrupter), WaitOutcome::kTimedOut);
  auto setter = std::async(std::launch::async, [&] {
    EtcdStore s(store_options(etcd, "/t2i/"));
    std::this_thread::sleep_for(200ms);
    s.set("k", "1");
  });
  EXPECT_EQ(waiter.wait_interruptibly({"k"}, 30s, interrupter), WaitOutcome::kSet);
  setter.get();
  // The store is usable after an interrupted watch (its stream connection was dropped).
  EXPECT_EQ(waiter.get("k"), "1");
}

TEST(EtcdStore, ConcurrentAddsCountEveryIncrementOnce) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd;
  constexpr int kThreads = 4, kAdds = 25;
  std::vector<std::future<std::vector<int64_t>>> f;
  for (int t = 0; t < kThreads; ++t) {
    f.push_back(std::async(std::launch::async, [&] {
      EtcdStore s(store_options(etcd, "/t3/"));
      std::vector<int64_t> seen;
      for (int i = 0; i < kAdds; ++i) seen.push_back(s.add("counter", 1));
      return seen;
    }));
  }
  std::set<int64_t> all;
  for (auto& x : f) {
    for (int64_t v : x.get()) EXPECT_TRUE(all.insert(v).second) << "value " << v << " twice";
  }
  EXPECT_EQ(all.size(), size_t(kThreads * kAdds));
  EXPECT_EQ(*all.rbegin(), kThreads * kAdds);
  EtcdStore s(store_options(etcd, "/t3/"));
  EXPECT_EQ(s.add("counter", 0), kThreads * kAdds);
  EXPECT_EQ(std::stoll(s.get("counter")), kThreads * kAdds);
}

// More keys than one txn holds (node 0 of a large round): the chunks go out at once on several
// connections, and every value comes back to its own key, in the order asked for; a wait for
// such a set ends when a key of a late chunk is set by another client.
TEST(EtcdStore, ManyKeysTakeParallelTxnsAndComeBackInOrder) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd;
  EtcdStore s(store_options(etcd, "/t3m/"));
  s.set_timeout(30s);
  constexpr int kKeys = 1000;  // 16 txns of 64
  std::vector<std::string> keys, values;
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back(fmt::format("rank/{}", i));
    values.push_back(fmt::format("value {}", i * 7));
  }
  s.multi_set(keys, values);
  std::vector<std::string> reversed_keys(keys.rbegin(), keys.rend());
  std::vector<std::string> reversed_values(values.rbegin(), values.rend());
  EXPECT_EQ(s.multi_get(reversed_keys), reversed_values);
  EXPECT_TRUE(s.check(keys));
  keys.push_back("rank/late");
  EXPECT_FALSE(s.check(keys));
  auto setter = std::async(std::launch::async, [&] {
    EtcdStore other(store_options(etcd, "/t3m/"));
    std::this_thread::sleep_for(300ms);
    other.set("rank/late", "at last");
  });
  EXPECT_EQ(s.multi_get(keys).back(), "at last");
  setter.get();
}

// A loopback HTTP server in front of a real etcd: it forwards every request, counts them by
// path, and can drop the reply of the next txn, answering etcd's "request timed out" instead
// (etcd may apply a request whose proposal timed out: the client sends it again).
class ForwardingEtcd {
 public:
  explicit ForwardingEtcd(const EtcdProcess& etcd)
      : etcd_(etcd::http_options(store_options(etcd, "/"))),
        server_([this](const std::string& request) { return forward(request); }) {}
  Endpoint endpoint() const { return {"127.0.0.1", server_.port()}; }
  int requests(const std::string& path) {
    std::lock_guard<std::mutex> lock(mutex_);
    return counts_[path];
  }
  void drop_next_txn_reply() { drop_next_txn_ = true; }
  bool dropped() const { return !drop_next_txn_; }

 private:
  std::string forward(const std::string& request) {
    const size_t space = request.find(' '), path_end = request.find(' ', space + 1);
    const std::string path = request.substr(space + 1, path_end - space - 1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++counts_[path];
    }
    std::string status = "200 OK", body;
    try {
      body =
          etcd_.call(path, etcd::Json::parse(request.substr(request.find("\r\n\r\n") + 4))).dump();
    } catch (const Error& e) {
      status = "500 Internal Server Error";
      body = etcd::Json{{"error", e.what()}, {"code", 2}, {"message", e.what()}}.dump();
    }
    if (path == "/v3/kv/txn" && drop_next_txn_.exchange(false)) {
      status = "503 Service Unavailable";
      body = R"({"error":"etcdserver: request timed out","code":14,)"
             R"("message":"etcdserver: request timed out"})";
    }
    return json_http_reply(status, body);
  }

  etcd::EtcdHttp etcd_;
  std::mutex mutex_;
  std::map<std::string, int> counts_;
  std::atomic<bool> drop_next_txn_{false};
  FakeHttpServer server_;  // last: it calls forward() until destroyed
};

EtcdStoreOptions through(const ForwardingEtcd& proxy, const std::string& prefix) {
  EtcdStoreOptions o;
  o.endpoints = {proxy.endpoint()};
  o.prefix = prefix;
  o.connect_timeout = 3s;
  o.read_timeout = 20s;
  return o;
}

// What 10,000 agents joining one round on etcd cost it (bench/rendezvous/README.md): an
// increment of 1 is one txn, whatever the counter's size (one etcd revision: before, two, and
// a count of every earlier increment's ticket), and a compare_set whose compare fails sends no
// txn at all (a txn with a put is a raft proposal even when its compare fails).
TEST(EtcdStore, AnIncrementIsOneTxnAndAFailingCompareSetSendsNone) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd;
  ForwardingEtcd proxy(etcd);
  EtcdStore s(through(proxy, "/t3p/"));
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.compare_set("generation", "", "0"), "0");
  EXPECT_EQ(proxy.requests("/v3/kv/txn"), 1) << "compare_sets that could not set sent a txn";
  EXPECT_EQ(s.compare_set("generation", "0", "1"), "1");
  EXPECT_EQ(s.compare_set("generation", "0", "2"), "1");
  EXPECT_EQ(proxy.requests("/v3/kv/txn"), 2);

  const int64_t revision = s.revision();
  const int txns = proxy.requests("/v3/kv/txn");
  for (int i = 1; i <= 50; ++i) ASSERT_EQ(s.add("slot", 1), i);
  EXPECT_EQ(proxy.requests("/v3/kv/txn") - txns, 50);
  EXPECT_EQ(s.revision() - revision, 50) << "an increment wrote more than once";
  EXPECT_EQ(s.add("slot", 0), 50);
}

// A txn whose reply was lost (etcd answered "request timed out" after applying it) is sent
// again and counts once: the increment of 1, and an add of another delta.
TEST(EtcdStore, AnAddSentAgainAfterALostReplyCountsOnce) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd;
  ForwardingEtcd proxy(etcd);
  EtcdStore s(through(proxy, "/t3r/"));
  EXPECT_EQ(s.add("c", 1), 1);
  proxy.drop_next_txn_reply();
  EXPECT_EQ(s.add("c", 1), 2);
  EXPECT_TRUE(proxy.dropped());
  EXPECT_EQ(s.add("c", 0), 2) << "the increment sent again counted twice";
  EXPECT_EQ(s.add("c", 1), 3);

  proxy.drop_next_txn_reply();
  EXPECT_EQ(s.add("ranks", 4), 4);
  EXPECT_TRUE(proxy.dropped());
  EXPECT_EQ(s.add("ranks", 0), 4);
  EXPECT_EQ(s.add("ranks", 2), 6);
}

TEST(EtcdStore, LeasedKeysOutliveTheirWriterAndVanishAfterTheLastClient) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd;
  EtcdStoreOptions o = store_options(etcd, "/t4/");
  o.lease_key = "lease";
  o.lease_ttl = 3s;
  o.unleased_prefixes = {"keep/"};
  EtcdStore reader(store_options(etcd, "/t4/"));  // no lease: only reads
  {
    auto a = std::make_unique<EtcdStore>(o);
    EtcdStore b(o);
    a->set("shared", "by a");
    a->set("keep/count", "7");
    a.reset();  // a is gone; b renews the same lease
    std::this_thread::sleep_for(4s);
    EXPECT_TRUE(reader.check({"shared"})) << "the key vanished while a client of its lease lives";
    b.set("shared", "by b");
  }
  // Every client is gone: etcd deletes the leased keys within the TTL (bounded wait).
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = !reader.check({"shared"});
    if (!gone) std::this_thread::sleep_for(100ms);
  }
  EXPECT_TRUE(gone) << "leased key still present 10 s after its last client";
  EXPECT_TRUE(reader.check({"keep/count"})) << "an unleased key was deleted";
}

// The membership watcher's heartbeat on etcd (KeptAliveKeys): a key attached to a lease of its
// writer's lives while the writer renews the lease, and renewals write nothing (etcd's revision
// stands still); once the writer stops renewing, etcd deletes the key within its TTL. A writer
// whose lease expired writes the key again, unless a peer's verdict took its place.
TEST(EtcdStore, KeptAliveKeyLivesWhileRenewedWritesNothingAndVanishesAfterItsTtl) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd;
  EtcdStore writer(store_options(etcd, "/t9/"));
  EtcdStore reader(store_options(etcd, "/t9/"));
  auto present = [&] { return reader.read_now({"hb"}).front().has_value(); };
  auto vanished_within = [&](std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      if (!present()) return true;
      std::this_thread::sleep_for(100ms);
    }
    return false;
  };
  writer.keep_alive("hb", "alive", 2s);
  EXPECT_EQ(reader.read_now({"hb", "absent"}),
            (std::vector<std::optional<std::string>>{"alive", std::nullopt}));
  const int64_t revision = reader.revision();
  for (int i = 0; i < 8; ++i) {  // 4 s of renewals: twice the TTL
    std::this_thread::sleep_for(500ms);
    writer.keep_alive("hb", "alive", 2s);
  }
  EXPECT_TRUE(present()) << "a key whose lease was renewed vanished";
  EXPECT_EQ(reader.revision(), revision) << "renewing the lease wrote to etcd";

  EXPECT_TRUE(vanished_within(10s)) << "the key outlived its unrenewed lease by 8 s";
  writer.keep_alive("hb", "alive", 2s);  // the lease expired: written again
  EXPECT_TRUE(present());

  EXPECT_TRUE(vanished_within(10s));
  reader.set("hb", "lost");              // a peer took the silent node as lost meanwhile
  writer.keep_alive("hb", "alive", 2s);  // its verdict stands
  EXPECT_EQ(reader.read_now({"hb"}).front(), std::optional<std::string>("lost"));
}

TEST(EtcdStore, UnreachableEndpointFailsNamingItAndTheFix) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdStoreOptions o;
  RefusingPort refusing;
  const uint16_t port = refusing.port;
  o.endpoints = {{"127.0.0.1", port}};
  o.connect_timeout = 500ms;
  EXPECT_TRUE(throws_with<NetworkError>(
      [&] { EtcdStore s(o); }, {"cannot reach etcd", fmt::format("127.0.0.1:{}", port).c_str(),
                                "connect_timeout", "--listen-client-urls"}));
}

TEST(EtcdStore, EndpointThatIsNotEtcdFailsAtOnce) {
  DDP_SKIP_WITHOUT_ETCD();
  // A TCP server that answers every request with a fixed HTTP reply that is not etcd's.
  FakeHttpServer server([](const std::string&) {
    return std::string(
        "HTTP/1.1 200 OK\r\nContent-Length: 11\r\nConnection: close\r\n\r\nhello world");
  });
  EtcdStoreOptions o;
  o.endpoints = {{"127.0.0.1", server.port()}};
  o.connect_timeout = 1s;
  EXPECT_TRUE(throws_with<ProtocolError>([&] { EtcdStore s(o); },
                                         {"not etcd's v3 JSON API", "hello world", "2379"}));
}

TEST(EtcdStore, FailsOverToTheNextMember) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd;
  EtcdStoreOptions o = store_options(etcd, "/t5/");
  RefusingPort dead;
  o.endpoints.insert(o.endpoints.begin(), Endpoint{"127.0.0.1", dead.port});
  EtcdStore s(o);
  s.set("k", "v");
  EXPECT_EQ(s.get("k"), "v");
}

// A member that accepts connections and never answers (a listening socket nobody reads, as a
// SIGSTOPped etcd): reads, and so a get, go on to the next member after read_timeout instead
// of failing with a TimeoutError.
TEST(EtcdStore, FailsOverFromAMemberThatNeverAnswers) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd;
  net::Socket silent = net::listen_tcp("127.0.0.1", 0, 16);
  EtcdStoreOptions o = store_options(etcd, "/t6/");
  o.endpoints.insert(o.endpoints.begin(),
                     Endpoint{"127.0.0.1", static_cast<uint16_t>(net::local_port(silent.fd()))});
  o.read_timeout = 1s;
  auto start = std::chrono::steady_clock::now();
  EtcdStore s(o);
  s.set_timeout(5s);
  s.set("k", "v");
  EXPECT_EQ(s.get("k"), "v");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 8s);
  EXPECT_TRUE(s.check({"k"}));
}

// The lease is renewed through the next member when the first never answers: each renewal
// attempt is bounded by min(read_timeout, ttl/3) and a timed-out renewal fails over, so the
// run's keys outlive a stalled member.
TEST(EtcdStore, LeaseSurvivesAMemberThatNeverAnswers) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd;
  net::Socket silent = net::listen_tcp("127.0.0.1", 0, 16);
  EtcdStoreOptions o = store_options(etcd, "/t7/");
  o.endpoints.insert(o.endpoints.begin(),
                     Endpoint{"127.0.0.1", static_cast<uint16_t>(net::local_port(silent.fd()))});
  o.read_timeout = 2s;
  o.lease_key = "lease";
  o.lease_ttl = 3s;
  EtcdStore reader(store_options(etcd, "/t7/"));
  EtcdStore writer(o);
  writer.set("shared", "1");
  std::this_thread::sleep_for(6s);  // twice the TTL
  EXPECT_TRUE(reader.check({"shared"})) << "the lease expired while its client lives";
}

// A member that dies silently (SIGSTOP) while a get watches through it: the watch ends after
// watch_attempt, the keys are read again through the next member, and the get sees a put made
// through another member, well before its own limit.
TEST(EtcdStore, WaitFailsOverWhenTheWatchedMemberStops) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd(3);
  EtcdStoreOptions o = store_options(etcd, "/t8/");
  o.read_timeout = 2s;
  o.connect_timeout = 10s;
  o.watch_attempt = 1s;
  EtcdStore waiter(o);
  waiter.set_timeout(40s);
  auto got = std::async(std::launch::async, [&] { return waiter.get("k"); });
  std::this_thread::sleep_for(500ms);  // the watch is open on member 0
  etcd.signal(0, SIGSTOP);
  EtcdStoreOptions others = o;
  others.endpoints.erase(others.endpoints.begin());
  auto start = std::chrono::steady_clock::now();
  {
    EtcdStore setter(others);
    setter.set("k", "v");
  }
  bool ready = got.wait_for(25s) == std::future_status::ready;
  etcd.signal(0, SIGCONT);
  ASSERT_TRUE(ready) << "the get still waits on the stopped member";
  EXPECT_EQ(got.get(), "v");
  EXPECT_LT(std::chrono::steady_clock::now() - start, 25s);
}

// etcd's back-pressure ("etcdserver: too many requests": its apply loop is behind, and it
// refused before proposing) delays a write instead of failing it: the client sends it again
// after a pause. A first version took it as a refusal, and 4,000 agents' watchers ended their
// round on a busy etcd ("lost the rendezvous store").
TEST(EtcdStore, AnOverloadedEtcdDelaysAWriteInsteadOfFailingIt) {
  std::atomic<int> puts{0};
  FakeHttpServer server([&](const std::string& request) {
    std::string status = "200 OK";
    std::string body = R"({"header":{"revision":"5"}})";
    if (request.find("POST /v3/kv/put") == 0 && ++puts <= 2) {
      status = "500 Internal Server Error";
      body = R"({"error":"etcdserver: too many requests","code":2,)"
             R"("message":"etcdserver: too many requests"})";
    }
    return json_http_reply(status, body);
  });
  EtcdStoreOptions o;
  o.endpoints = {{"127.0.0.1", server.port()}};
  o.connect_timeout = 1s;
  o.read_timeout = 20s;
  EtcdStore s(o);
  EXPECT_NO_THROW(s.set("k", "v"));
  EXPECT_EQ(puts.load(), 3);
}

// etcd's JSON gateway refusing a request: HTTP `status` and etcd's error (gRPC `code`).
std::string etcd_refusal(const char* status, int code, const std::string& message) {
  const std::string body =
      fmt::format(R"({{"error":"{0}","code":{1},"message":"{0}"}})", message, code);
  return json_http_reply(status, body);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// A put through the etcd client itself (no store around it), for its retry budget.
void put_through(const etcd::HttpOptions& o) {
  etcd::EtcdHttp http(o);
  http.call("/v3/kv/put",
            etcd::Json{{"key", etcd::base64_encode("k")}, {"value", etcd::base64_encode("v")}});
}

// The 10,000 agents' etcd: two members refuse as "too many requests", the third answers
// "etcdserver: request timed out" (and here a listed member also refuses connections). The
// call keeps retrying for read_timeout whatever its latest failure says, and then names the
// overload and the fix. Before, a call's budget was that of its latest failure: it gave up
// after connect_timeout as soon as that was not "too many requests", saying "cannot reach
// etcd ... Check that etcd runs there".
TEST(EtcdStore, AnOverloadedClusterGetsReadTimeoutWhateverItsLatestAnswer) {
  FakeHttpServer busy([](const std::string&) {
    return etcd_refusal("429 Too Many Requests", 8, "etcdserver: too many requests");
  });
  FakeHttpServer slow([](const std::string&) {
    return etcd_refusal("503 Service Unavailable", 14, "etcdserver: request timed out");
  });
  RefusingPort dead;
  etcd::HttpOptions o;
  o.endpoints = {{"127.0.0.1", busy.port()}, {"127.0.0.1", slow.port()}, {"127.0.0.1", dead.port}};
  o.retry_for = 200ms;
  o.read_timeout = 3s;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(throws_with<StoreError>(
      [&] { put_through(o); },
      {fmt::format("etcd at 127.0.0.1:{}, 127.0.0.1:{} was overloaded for", busy.port(),
                   slow.port())
           .c_str(),
       "too many requests / request timed out", "Connection refused", "more CPU",
       "--rdzv-conf read_timeout (how long a call waits for an overloaded etcd, now 3.0 s)"}));
  // The budget counts from the first failure, after the start.
  EXPECT_GE(seconds_since(start), 3.0);
}

// Puts through members that each answer with one of `refusals` ({HTTP status, gRPC code,
// message}) and checks the call keeps retrying for read_timeout (3 s), not retry_for (200 ms),
// then fails with `check` (a throws_with on the call).
template <typename Check>
void expect_slow_cluster_budget(
    const std::vector<std::tuple<std::string, int, std::string>>& refusals, Check check) {
  std::vector<std::unique_ptr<FakeHttpServer>> members;
  etcd::HttpOptions o;
  for (const auto& refusal : refusals) {
    members.push_back(std::make_unique<FakeHttpServer>([refusal](const std::string&) {
      const auto& [status, code, message] = refusal;
      return etcd_refusal(status.c_str(), code, message);
    }));
    o.endpoints.push_back({"127.0.0.1", members.back()->port()});
  }
  o.retry_for = 200ms;
  o.read_timeout = 3s;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(check([&] { put_through(o); }));
  EXPECT_GE(seconds_since(start), 3.0);
}

// Members that answer only with etcd's own request timeout ("request timed out", etcd 3.4's
// "context deadline exceeded") are alive and too slow (or without quorum): read_timeout too,
// and a message naming both. Before: given up after connect_timeout, as a cluster without a
// leader.
TEST(EtcdStore, EtcdsOwnRequestTimeoutsGetReadTimeoutAndNameOverload) {
  expect_slow_cluster_budget(
      {{"503 Service Unavailable", 14, "etcdserver: request timed out"},
       {"500 Internal Server Error", 2, "context deadline exceeded"}},
      [](auto call) {
        return throws_with<NetworkError>(
            call,
            {"did not commit POST /v3/kv/put in time", "overloaded, or has lost its quorum",
             "context deadline exceeded", "--rdzv-conf read_timeout", "restart the lost members"});
      });
}

// Members that answer that their leader changed (elections on a starved cluster, measured with
// 10,000 agents on 3 members) have a quorum and come back: read_timeout, and a message naming
// the elections. Before: given up after connect_timeout as a cluster without a leader.
TEST(EtcdStore, ALeaderChangingOverAndOverGetsReadTimeoutAndNamesTheElections) {
  expect_slow_cluster_budget({{"503 Service Unavailable", 14, "etcdserver: leader changed"},
                              {"503 Service Unavailable", 14, "etcdserver: leader changed"}},
                             [](auto call) {
                               return throws_with<NetworkError>(
                                   call,
                                   {"the etcd cluster kept changing its leader", "leader changed",
                                    "--election-timeout", "--rdzv-conf read_timeout"});
                             });
}

// Members that never answer keep the short budget: a wrong endpoint list fails after
// connect_timeout, naming reachability, not after read_timeout.
TEST(EtcdStore, UnreachableMembersStillFailAfterConnectTimeout) {
  RefusingPort dead1, dead2;
  etcd::HttpOptions o;
  o.endpoints = {{"127.0.0.1", dead1.port}, {"127.0.0.1", dead2.port}};
  o.retry_for = 300ms;
  o.read_timeout = 60s;
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(throws_with<NetworkError>(
      [&] { put_through(o); }, {"cannot reach etcd for POST /v3/kv/put", "Connection refused",
                                "(--rdzv-conf connect_timeout)", "--listen-client-urls"}));
  EXPECT_LT(seconds_since(start), 30.0);  // far below read_timeout
}

// A loopback HTTP server that keeps its connections open (HTTP/1.1 keep-alive) and answers
// every request with `reply`; counts the connections the client closed.
class KeepAliveServer {
 public:
  explicit KeepAliveServer(std::string reply)
      : listener_(net::listen_tcp("127.0.0.1", 0, 16)),
        port_(static_cast<uint16_t>(net::local_port(listener_.fd()))),
        reply_(std::move(reply)),
        thread_([this] { serve(); }) {}
  ~KeepAliveServer() {
    stop_ = true;
    thread_.join();
  }
  uint16_t port() const { return port_; }
  int closed_by_client() const { return closed_; }

 private:
  void serve() {
    std::vector<int> conns;
    std::vector<std::string> pending;
    while (!stop_) {
      std::vector<pollfd> p{{listener_.fd(), POLLIN, 0}};
      for (int c : conns) p.push_back({c, POLLIN, 0});
      if (::poll(p.data(), p.size(), 100) <= 0) continue;
      if (p[0].revents & POLLIN) {
        int c = ::accept(listener_.fd(), nullptr, nullptr);
        if (c >= 0) {
          conns.push_back(c);
          pending.emplace_back();
        }
      }
      for (size_t i = 0; i + 1 < p.size(); ++i) {
        if (!(p[i + 1].revents & (POLLIN | POLLHUP))) continue;
        char buf[4096];
        ssize_t n = ::recv(conns[i], buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0) {
          ++closed_;
          ::close(conns[i]);
          conns[i] = -1;
          continue;
        }
        if (n < 0) continue;
        pending[i].append(buf, static_cast<size_t>(n));
        if (pending[i].find("\r\n\r\n") != std::string::npos && pending[i].back() == '}') {
          pending[i].clear();
          (void)!::write(conns[i], reply_.data(), reply_.size());
        }
      }
      for (size_t i = conns.size(); i-- > 0;) {
        if (conns[i] < 0) {
          conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(i));
          pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
        }
      }
    }
    for (int c : conns) ::close(c);
  }

  net::Socket listener_;
  uint16_t port_;
  std::string reply_;
  std::atomic<bool> stop_{false};
  std::atomic<int> closed_{0};
  std::thread thread_;
};

std::string http_json(const std::string& status, const std::string& body) {
  return fmt::format(
      "HTTP/1.1 {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}", status,
      body.size(), body);
}

// A client that failed over from a member keeps no connection to it: with curl's default cache
// of 5, each of thousands of agents held a connection to every member of a 3-member etcd after
// its elections (twice the descriptors at each member).
TEST(EtcdStore, KeepsNoConnectionToAMemberItFailedOverFrom) {
  KeepAliveServer leaderless(http_json("503 Service Unavailable",
                                       R"({"error":"etcdserver: no leader","code":14,)"
                                       R"("message":"etcdserver: no leader"})"));
  KeepAliveServer live(http_json("200 OK", R"({"header":{"revision":"5"}})"));
  EtcdStoreOptions o;
  o.endpoints = {{"127.0.0.1", leaderless.port()}, {"127.0.0.1", live.port()}};
  o.connect_timeout = 3s;
  EtcdStore s(o);  // its first request: refused by the first member, answered by the second
  // curl closes the connection idle longest once a second one is cached (ties within a
  // millisecond are broken either way): one more request, later, leaves the stale one oldest.
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(s.revision(), 5);
  auto deadline = std::chrono::steady_clock::now() + 2s;
  while (leaderless.closed_by_client() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(leaderless.closed_by_client(), 1) << "the connection to the member it left is open";
}

// A fake etcd that has no keys and cancels every watch at once: a wait opens watches after a
// growing pause (no busy loop against etcd), and its TimeoutError carries etcd's reason.
TEST(EtcdStore, AWatchCancelledOverAndOverBacksOffAndNamesTheReason) {
  DDP_SKIP_WITHOUT_ETCD();
  std::atomic<int> watches{0};
  FakeHttpServer server([&](const std::string& request) {
    std::string body;
    if (request.find("POST /v3/watch") == 0) {
      ++watches;
      body = R"({"result":{"header":{},"canceled":true,"cancel_reason":"test: no access"}})"
             "\n";
    } else if (request.find("POST /v3/kv/txn") == 0) {
      body = R"({"header":{"revision":"5"},"responses":[{"response_range":{"header":{}}}]})";
    } else {
      body = R"({"header":{"revision":"5"}})";
    }
    return fmt::format(
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n"
        "Connection: close\r\n\r\n{}",
        body.size(), body);
  });
  EtcdStoreOptions o;
  o.endpoints = {{"127.0.0.1", server.port()}};
  o.connect_timeout = 1s;
  o.read_timeout = 2s;
  {
    EtcdStore s(o);
    EXPECT_TRUE(throws_with<TimeoutError>(
        [&] { s.wait({"k"}, 2s); },
        {"waiting for 1 of 1 keys (k)", "etcd cancelled the last watch: test: no access"}));
  }
  // Pauses of 50, 100, 200, 400 ms, then 1 s: a handful of watches in 2 s, not hundreds.
  EXPECT_GE(watches.load(), 2);
  EXPECT_LE(watches.load(), 10);
}

// Agent i ("host<i>", 10.0.0.<i+1>) of run `run_id` on `etcd`, heartbeat 200 ms.
RendezvousOptions etcd_agent_options(const EtcdProcess& etcd, const std::string& run_id,
                                     NodeRange nodes, int i, std::chrono::milliseconds last_call) {
  RendezvousOptions o;
  o.backend = Backend::kEtcd;
  o.run_id = run_id;
  o.nodes = nodes;
  o.endpoints = etcd.endpoints();
  o.endpoint = o.endpoints.front();
  o.hostname = "host" + std::to_string(i);
  o.local_addr = "10.0.0." + std::to_string(i + 1);
  o.conf.join_timeout = 30s;
  o.conf.last_call_timeout = last_call;
  o.conf.heartbeat = 200ms;
  o.pick_master_port = [] { return 40000; };
  return o;
}

// The rendezvous protocol, unchanged, on etcd: 2 to 3 agents as threads, then one goes silent
// and a survivor's watcher names it.
TEST(EtcdRendezvous, ElasticRoundAndMissedHeartbeats) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd;
  std::vector<std::unique_ptr<Rendezvous>> agents;
  std::vector<std::shared_ptr<EtcdStore>> stores;
  for (int i = 0; i < 2; ++i) {
    const RendezvousOptions o = etcd_agent_options(etcd, "etcdjob", {2, 3}, i, 500ms);
    stores.push_back(std::make_shared<EtcdStore>(etcd_store_options(o)));
    agents.push_back(std::make_unique<Rendezvous>(o, stores.back()));
  }
  std::vector<std::future<RoundInfo>> f;
  for (auto& a : agents)
    f.push_back(std::async(std::launch::async, [&a] { return a->next_round(); }));
  RoundInfo r0 = f[0].get(), r1 = f[1].get();
  EXPECT_EQ(r0.num_nodes, 2);
  EXPECT_EQ(r1.num_nodes, 2);
  EXPECT_EQ(r0.generation, r1.generation);
  EXPECT_NE(r0.node_rank, r1.node_rank);
  const RoundInfo& first = r0.node_rank == 0 ? r0 : r1;
  EXPECT_EQ(r0.master_addr, first.master_addr);

  // Only agent 0 heartbeats: its watcher must report agent 1 silent.
  std::promise<std::string> reason;
  MembershipWatcher w(agents[0]->options(), agents[0]->round(), stores[0],
                      [&](const std::string& why) { reason.set_value(why); });
  auto got = reason.get_future();
  ASSERT_EQ(got.wait_for(30s), std::future_status::ready);
  EXPECT_NE(got.get().find("missed 3 heartbeats"), std::string::npos);
}

// On etcd the watchers heartbeat by renewing their leases: a round's idle members write nothing
// (etcd's revision stands still over several heartbeats; with counters every beat of every node
// is a write), and a member that stops renewing is named once its key expired.
TEST(EtcdRendezvous, IdleWatchersWriteNothingAndAMemberWhoseLeaseExpiredIsNamed) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd;
  std::vector<std::unique_ptr<Rendezvous>> agents;
  std::vector<std::shared_ptr<EtcdStore>> stores;
  for (int i = 0; i < 2; ++i) {
    const RendezvousOptions o = etcd_agent_options(etcd, "etcdlease", {2, 2}, i, 1s);
    stores.push_back(std::make_shared<EtcdStore>(etcd_store_options(o)));
    agents.push_back(std::make_unique<Rendezvous>(o, stores.back()));
  }
  std::vector<std::future<RoundInfo>> f;
  for (auto& a : agents)
    f.push_back(std::async(std::launch::async, [&a] { return a->next_round(); }));
  f[0].get();
  f[1].get();
  std::promise<std::string> reason;
  MembershipWatcher w0(agents[0]->options(), agents[0]->round(), stores[0],
                       [&](const std::string& why) { reason.set_value(why); });
  auto w1 = std::make_unique<MembershipWatcher>(agents[1]->options(), agents[1]->round(), stores[1],
                                                [](const std::string&) {});
  std::this_thread::sleep_for(1s);  // both have beaten: their keys are on their leases
  EtcdStore observer(etcd_store_options(agents[0]->options()));
  const int64_t revision = observer.revision();
  std::this_thread::sleep_for(2s);  // 10 heartbeats of each watcher
  EXPECT_EQ(observer.revision(), revision) << "idle watchers wrote to etcd";
  EXPECT_FALSE(w0.reason().has_value()) << *w0.reason();

  w1.reset();  // agent 1 stops heartbeating (its lease is not revoked: as if it died)
  auto got = reason.get_future();
  ASSERT_EQ(got.wait_for(30s), std::future_status::ready);
  const std::string why = got.get();
  EXPECT_NE(why.find("missed 3 heartbeats (its liveness key expired"), std::string::npos) << why;
  EXPECT_NE(why.find("(host1, 10.0.0.2)"), std::string::npos) << why;
}

// Two agents of one etcd run (options(0), options(1)) form a round: their rendezvous, stores
// and rounds.
struct EtcdPair {
  std::vector<std::unique_ptr<Rendezvous>> agents;
  std::vector<std::shared_ptr<EtcdStore>> stores;
  std::vector<RoundInfo> rounds;
};
EtcdPair form_etcd_pair(const std::function<RendezvousOptions(int)>& options) {
  EtcdPair p;
  for (int i = 0; i < 2; ++i) {
    p.stores.push_back(std::make_shared<EtcdStore>(etcd_store_options(options(i))));
    p.agents.push_back(std::make_unique<Rendezvous>(options(i), p.stores.back()));
  }
  std::vector<std::future<RoundInfo>> f;
  for (auto& a : p.agents)
    f.push_back(std::async(std::launch::async, [&a] { return a->next_round(); }));
  for (auto& r : f) p.rounds.push_back(r.get());
  return p;
}

// --recovery step on etcd: a node lost while the round runs is taken in place, and a node that
// arrives later takes its place (etcd's counters only count up: the round counts the slots
// taken back apart from the losses).
TEST(EtcdRendezvous, ANodeArrivingAfterALossTakenInPlaceTakesItsPlace) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd;
  auto options = [&](int i) {
    RendezvousOptions o = etcd_agent_options(etcd, "etcdsteps", {1, 2}, i, 2s);
    o.take_lost_slots = true;
    return o;
  };
  EtcdPair pair = form_etcd_pair(options);
  auto& agents = pair.agents;
  auto& stores = pair.stores;
  const RoundInfo r0 = pair.rounds[0];
  ASSERT_EQ(r0.num_nodes, 2);
  Rendezvous& survivor = r0.node_rank == 0 ? *agents[0] : *agents[1];
  auto survivor_store = r0.node_rank == 0 ? stores[0] : stores[1];
  std::promise<int> lost;
  std::atomic<bool> lost_once{false};
  std::promise<std::string> ended;
  MembershipWatcher w(
      survivor.options(), survivor.round(), survivor_store,
      [&](const std::string& why) { ended.set_value(why); },
      [&](const LostPeer& peer) {
        if (!lost_once.exchange(true)) lost.set_value(peer.node_rank);
        return true;
      });
  // The other agent never heartbeats: it is taken as lost in place.
  auto lost_future = lost.get_future();
  ASSERT_EQ(lost_future.wait_for(30s), std::future_status::ready);
  EXPECT_EQ(lost_future.get(), 1);

  auto joiner_store = std::make_shared<EtcdStore>(etcd_store_options(options(2)));
  Rendezvous joiner(options(2), joiner_store);
  const RoundInfo round = joiner.next_round();
  EXPECT_TRUE(round.took_lost_slot);
  EXPECT_EQ(round.node_rank, 1);
  EXPECT_EQ(round.generation, survivor.round().generation);
  MembershipWatcher joined(joiner.options(), round, joiner_store, [](const std::string&) {});
  std::this_thread::sleep_for(200ms * (kMissedHeartbeats + 3));
  EXPECT_FALSE(w.reason().has_value()) << *w.reason();
  EXPECT_FALSE(joined.reason().has_value()) << *joined.reason();
}

// --recovery step on etcd: a node arriving at a running round below its maximum grows it (its
// join slot, ranks after the world size: etcd's add() takes its workers as one increment), the
// members' rings watch it, and its silence is a loss taken in place.
TEST(EtcdRendezvous, ANodeArrivingWithNoLostPlaceGrowsTheRunningRound) {
  DDP_SKIP_WITHOUT_ETCD();
  EtcdProcess etcd;
  auto options = [&](int i) {
    RendezvousOptions o = etcd_agent_options(etcd, "etcdgrow", {2, 3}, i, 2s);
    o.take_lost_slots = true;
    o.local_world_size = 2;
    return o;
  };
  EtcdPair pair = form_etcd_pair(options);
  auto& agents = pair.agents;
  auto& stores = pair.stores;
  ASSERT_EQ(pair.rounds[0].num_nodes, 2);
  ASSERT_EQ(pair.rounds[1].num_nodes, 2);
  std::mutex mutex;
  std::vector<LostPeer> lost;
  std::vector<std::unique_ptr<MembershipWatcher>> watchers;
  for (int i = 0; i < 2; ++i) {
    watchers.push_back(std::make_unique<MembershipWatcher>(
        agents[i]->options(), agents[i]->round(), stores[i], [](const std::string&) {},
        [&](const LostPeer& peer) {
          std::lock_guard<std::mutex> lock(mutex);
          lost.push_back(peer);
          return true;
        }));
  }
  auto joiner_store = std::make_shared<EtcdStore>(etcd_store_options(options(2)));
  Rendezvous joiner(options(2), joiner_store);
  const RoundInfo round = joiner.next_round();
  EXPECT_TRUE(round.grew_round);
  EXPECT_EQ(round.node_rank, 2);
  EXPECT_EQ(round.rank_offset, 4);
  EXPECT_EQ(round.world_size, 6);
  EXPECT_EQ(round.launch_world_size, 4);
  EXPECT_EQ(round.generation, agents[0]->round().generation);
  auto joined = std::make_unique<MembershipWatcher>(joiner.options(), round, joiner_store,
                                                    [](const std::string&) {});
  std::this_thread::sleep_for(200ms * (kMissedHeartbeats + 3));
  for (auto& w : watchers) EXPECT_FALSE(w->reason().has_value()) << *w->reason();
  EXPECT_FALSE(joined->reason().has_value()) << *joined->reason();
  {
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_TRUE(lost.empty()) << "a node was taken for lost: " << lost.front().why;
  }
  // Its lease expires once it stops: the ring takes the loss, with its ranks.
  joined.reset();
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!lost.empty()) break;
    }
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << "the grown node is not watched";
    std::this_thread::sleep_for(20ms);
  }
  std::lock_guard<std::mutex> lock(mutex);
  EXPECT_EQ(lost.front().node_rank, 2);
  EXPECT_EQ(lost.front().first_rank, 4);
  EXPECT_EQ(lost.front().num_ranks, 2);
}

}  // namespace
}  // namespace ddp::rdzv::test
