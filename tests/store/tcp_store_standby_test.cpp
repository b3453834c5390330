// Standby stores (docs/store-protocol.md, "Standby stores"): a primary replicates every write
// to its standby before answering it, the standby refuses clients until it is promoted, and a
// client whose store's host died goes on with the promoted standby, each write applied once.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <future>
#include <thread>

#include "ddp/util/error.hpp"
#include "store_test_util.hpp"

namespace ddp::test {
namespace {

using Op = store_protocol::Op;

std::unique_ptr<TcpStoreServer> start_standby(std::optional<std::string> token = "") {
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.token = std::move(token);
  options.standby = true;
  auto server = std::make_unique<TcpStoreServer>(options);
  server->start();
  return server;
}

std::string endpoint_of(const TcpStoreServer& server) {
  return net::format_endpoint("127.0.0.1", server.port());
}

// A store host that is cut off rather than dead: it answers the handshake of every connection
// and then nothing (its requests wait in vain, as over a link taken down), until destroyed.
class SilentHost {
 public:
  SilentHost() : listener_(net::listen_tcp("127.0.0.1", 0, 16)) {
    port_ = net::local_port(listener_.fd());
    thread_ = std::thread([this] { serve(); });
  }
  ~SilentHost() {
    stop_ = true;
    thread_.join();
  }
  uint16_t port() const { return port_; }

 private:
  void serve() {
    std::vector<net::Socket> held;
    while (!stop_) {
      pollfd fd = {listener_.fd(), POLLIN, 0};
      if (::poll(&fd, 1, 20) <= 0) continue;
      net::Socket conn(::accept(listener_.fd(), nullptr, nullptr));
      auto hello = raw_read_frame(conn);
      raw_send(conn, encode(Op::kOk, {"auth:none"}, hello.request_id));
      held.push_back(std::move(conn));  // open, never answered again
    }
  }
  net::Socket listener_;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// The primary's replicator connects on its own thread: wait until it has a replica (bounded:
// a write answered before the replicator connected proves nothing, seen under ctest -j4), then
// until it sent its copy: a write is answered only once a replicating primary's standby has it.
void wait_until_replicating(TcpStoreServer& primary, TcpStore& client) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (primary.replica().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  ASSERT_FALSE(primary.replica().empty()) << "the primary found no standby within 10 s";
  client.set("replication-started", "1");
}

TEST(TcpStoreStandby, RefusesClientsUntilPromotedSayingWhy) {
  auto standby = start_standby();
  try {
    TcpStore client(client_options(standby->port(), 500ms));
    FAIL() << "a standby that was not promoted served a client";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("standby"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("promoted"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(standby->is_standby());
  EXPECT_EQ(promote_first_standby({endpoint_of(*standby)}, std::string(), 2s),
            endpoint_of(*standby));
  EXPECT_FALSE(standby->is_standby());
  TcpStore client(client_options(standby->port(), 2s));
  client.set("k", "v");
  EXPECT_EQ(client.get("k"), "v");
}

TEST(TcpStoreStandby, APromotedStandbyHoldsTheCopyAndEveryAnsweredWrite) {
  auto primary = start_server();
  TcpStore writer(client_options(primary->port()));
  writer.set("before", "copied");  // written before replication starts: in the copy
  writer.add("counter", 5);
  auto standby = start_standby();
  primary->replicate_to({endpoint_of(*standby)});
  wait_until_replicating(*primary, writer);
  EXPECT_EQ(primary->replica(), endpoint_of(*standby));
  writer.set("after", "streamed");
  EXPECT_EQ(writer.add("counter", 2), 7);
  EXPECT_EQ(writer.compare_set("cas", "", "new"), "new");
  writer.multi_set({"m1", "m2"}, {"a", "b"});
  writer.set("gone", "x");
  EXPECT_TRUE(writer.delete_key("gone"));

  promote_first_standby({endpoint_of(*standby)}, std::string(), 2s);
  TcpStore reader(client_options(standby->port()));
  EXPECT_EQ(reader.get("before"), "copied");
  EXPECT_EQ(reader.get("after"), "streamed");
  EXPECT_EQ(reader.add("counter", 0), 7);
  EXPECT_EQ(reader.get("cas"), "new");
  EXPECT_EQ(reader.multi_get({"m1", "m2"}), (std::vector<std::string>{"a", "b"}));
  EXPECT_FALSE(reader.check({"gone"}));
}

TEST(TcpStoreStandby, AClientGoesOnWithThePromotedStandbyWhenTheStoreHostDies) {
  auto primary = start_server();
  auto standby = start_standby();
  primary->replicate_to({endpoint_of(*standby)});
  TcpStoreOptions o = client_options(primary->port(), 10s);
  o.standbys = {endpoint_of(*standby)};
  TcpStore client(o);
  wait_until_replicating(*primary, client);
  EXPECT_EQ(client.add("generation", 1), 1);

  // A wait in flight when the host dies is sent again to the promoted standby.
  auto waiting = std::async(std::launch::async, [&] { client.wait({"late-key"}, 10s); });
  std::this_thread::sleep_for(200ms);
  primary->stop();
  EXPECT_EQ(waiting.wait_for(300ms), std::future_status::timeout)
      << "the wait ended although no standby serves yet";
  promote_first_standby({endpoint_of(*standby)}, std::string(), 2s);
  {
    TcpStore other(client_options(standby->port()));
    other.set("late-key", "1");
  }
  waiting.get();
  EXPECT_EQ(client.endpoint(), endpoint_of(*standby));
  EXPECT_EQ(client.add("generation", 1), 2);
}

TEST(TcpStoreStandby, ACallThatGotNoReplyTriesTheNextEndpointFirst) {
  SilentHost cut_off;
  auto standby = start_standby();
  promote_first_standby({endpoint_of(*standby)}, std::string(), 2s);
  TcpStoreOptions o = client_options(cut_off.port(), 300ms);
  o.standbys = {endpoint_of(*standby)};
  TcpStore client(o);  // the cut-off host still completes handshakes
  EXPECT_THROW(client.set("k", "v"), TimeoutError);
  // Without the skip it would connect to the silent host again and time out again.
  client.set("k", "v");
  EXPECT_EQ(client.endpoint(), endpoint_of(*standby));
  EXPECT_EQ(client.get("k"), "v");
}

TEST(TcpStoreStandby, APromoterSendsItsNextCallStraightToThePromotedStandby) {
  SilentHost cut_off;
  auto standby = start_standby();
  TcpStoreOptions o = client_options(cut_off.port(), 2s);
  o.standbys = {endpoint_of(*standby)};
  TcpStore client(o);
  const std::string promoted = promote_first_standby({endpoint_of(*standby)}, std::string(), 2s);
  client.prefer_endpoint(promoted);
  client.set("k", "v");  // without the preference: no reply from the silent host, TimeoutError
  EXPECT_EQ(client.endpoint(), promoted);
  EXPECT_THROW(client.prefer_endpoint("127.0.0.1:1"), UsageError);
}

TEST(TcpStoreStandby, AWriteSentAgainUnderItsRequestIdIsAppliedOnce) {
  // The stream carries the writer's id and request id; after the promotion the writer sends
  // the same add again (its reply was lost with the host): it gets the first reply.
  auto standby = start_standby();
  auto stream = raw_connect(standby->port());
  raw_send(stream, encode(Op::kHello, {store_protocol::kReplicaRole}));
  ASSERT_EQ(raw_read_frame(stream).op, Op::kOk);
  raw_send(stream,
           encode(Op::kReplicate,
                  {"c0ffee", store_protocol::encode_i64(7),
                   std::string(1, static_cast<char>(Op::kAdd)), "n", store_protocol::encode_i64(5)},
                  2));
  auto replicated = raw_read_frame(stream);
  ASSERT_EQ(replicated.op, Op::kOk);
  ASSERT_EQ(replicated.fields.size(), 2u);
  EXPECT_EQ(static_cast<Op>(replicated.fields[0][0]), Op::kOk);
  EXPECT_EQ(store_protocol::decode_i64(replicated.fields[1], "n"), 5);

  promote_first_standby({endpoint_of(*standby)}, std::string(), 2s);
  auto client = raw_connect(standby->port());
  raw_send(client, encode(Op::kHello, {std::string(store_protocol::kClientRole) + " id=c0ffee"}));
  ASSERT_EQ(raw_read_frame(client).op, Op::kOk);
  raw_send(client, encode(Op::kAdd, {"n", store_protocol::encode_i64(5)}, 7));
  auto again = raw_read_frame(client);
  ASSERT_EQ(again.op, Op::kOk);
  EXPECT_EQ(store_protocol::decode_i64(again.fields.at(0), "n"), 5) << "applied twice";
  raw_send(client, encode(Op::kAdd, {"n", store_protocol::encode_i64(5)}, 8));
  EXPECT_EQ(store_protocol::decode_i64(raw_read_frame(client).fields.at(0), "n"), 10);
}

TEST(TcpStoreStandby, APrimaryWhoseStandbyIsGoneGoesOnAlone) {
  auto primary = start_server();
  auto standby = start_standby();
  primary->replicate_to({endpoint_of(*standby)}, 500ms);
  TcpStore client(client_options(primary->port()));
  wait_until_replicating(*primary, client);
  standby->stop();
  client.set("k", "v");  // waits at most the replica timeout, then the primary goes on
  EXPECT_EQ(client.get("k"), "v");
  EXPECT_EQ(primary->replica(), "");
}

TEST(TcpStoreStandby, APromotedStandbyReplicatesToTheNextOne) {
  auto primary = start_server();
  auto first = start_standby();
  auto second = start_standby();
  primary->replicate_to({endpoint_of(*first)});
  TcpStore writer(client_options(primary->port()));
  wait_until_replicating(*primary, writer);
  writer.set("k", "1");
  primary->stop();
  EXPECT_EQ(promote_first_standby({endpoint_of(*first), endpoint_of(*second)}, std::string(), 2s),
            endpoint_of(*first));
  TcpStore on_first(client_options(first->port()));
  on_first.set("k2", "2");  // answered once the second standby has it
  EXPECT_EQ(first->replica(), endpoint_of(*second));
  first->stop();
  // The first standby is gone: the second is promoted, with both writes.
  EXPECT_EQ(promote_first_standby({endpoint_of(*first), endpoint_of(*second)}, std::string(), 1s),
            endpoint_of(*second));
  TcpStore on_second(client_options(second->port()));
  EXPECT_EQ(on_second.get("k"), "1");
  EXPECT_EQ(on_second.get("k2"), "2");
}

TEST(TcpStoreStandby, AnOldPrimaryCannotWriteIntoAPromotedStandby) {
  // A network split: the standby was promoted while the primary lives. The primary's stream
  // ends, so its later writes do not land in the promoted store.
  auto primary = start_server();
  auto standby = start_standby();
  primary->replicate_to({endpoint_of(*standby)});
  TcpStore writer(client_options(primary->port()));
  wait_until_replicating(*primary, writer);
  promote_first_standby({endpoint_of(*standby)}, std::string(), 2s);
  writer.set("after-split", "x");
  EXPECT_EQ(primary->replica(), "");
  TcpStore reader(client_options(standby->port()));
  EXPECT_FALSE(reader.check({"after-split"}));
  EXPECT_TRUE(reader.check({"replication-started"}));
}

TEST(TcpStoreStandby, TheStandbyTakesTheStreamOnlyFromAReplicationConnectionWithTheToken) {
  auto standby = start_standby("secret");
  auto raw = raw_connect(standby->port());
  raw_send(raw, encode(Op::kHello, {store_protocol::kReplicaRole}));
  auto challenge = raw_read_frame(raw);
  EXPECT_EQ(challenge.op, Op::kChallenge);  // the stream authenticates like any client
  raw_send(raw, encode(Op::kAuth, {"wrong"}, 2));
  EXPECT_EQ(raw_read_frame(raw).op, Op::kError);

  // A primary without the token cannot replicate into it: it goes on alone.
  auto primary = start_server("other");
  primary->replicate_to({endpoint_of(*standby)}, 500ms);
  TcpStore writer(client_options(primary->port(), 10s, "other"));
  writer.set("k", "v");
  EXPECT_EQ(primary->replica(), "");
  EXPECT_TRUE(standby->is_standby());
}

// A raw connection to 127.0.0.1:`port` from the loopback address `source` (127.0.0.0/8 is all
// loopback): a second host's address without a second host.
net::Socket raw_connect_from(const std::string& source, uint16_t port) {
  net::Socket sock(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in from{};
  from.sin_family = AF_INET;
  ::inet_pton(AF_INET, source.c_str(), &from.sin_addr);
  EXPECT_EQ(::bind(sock.fd(), reinterpret_cast<sockaddr*>(&from), sizeof(from)), 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  ::inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  EXPECT_EQ(::connect(sock.fd(), reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
  return sock;
}

// Issue 49, finding 8: a standby of a job without a token takes the replication stream only
// from the address of its first one (its primary's): a stranger elsewhere on the network
// cannot replace the copy a later failover serves.
TEST(TcpStoreStandby, WithoutATokenOnlyTheFirstStreamsAddressMayReplicate) {
  auto standby = start_standby();
  auto primary = raw_connect_from("127.0.0.1", standby->port());
  raw_send(primary, encode(Op::kHello, {store_protocol::kReplicaRole}));
  ASSERT_EQ(raw_read_frame(primary).op, Op::kOk);
  auto stranger = raw_connect_from("127.0.0.2", standby->port());
  raw_send(stranger, encode(Op::kHello, {store_protocol::kReplicaRole}));
  const auto refused = raw_read_frame(stranger);
  ASSERT_EQ(refused.op, Op::kError);
  ASSERT_FALSE(refused.fields.empty());
  EXPECT_NE(refused.fields.back().find("give the job a token"), std::string::npos)
      << refused.fields.back();
  // The primary's address may connect again (a stream that broke and came back).
  auto again = raw_connect_from("127.0.0.1", standby->port());
  raw_send(again, encode(Op::kHello, {store_protocol::kReplicaRole}));
  EXPECT_EQ(raw_read_frame(again).op, Op::kOk);
}

}  // namespace
}  // namespace ddp::test
