// The endpoint store: failing fast on an unreachable endpoint, and auth keeping strangers out.
#include <gtest/gtest.h>

#include <thread>

#include "ddp/rendezvous/endpoint_store.hpp"
#include "ddp/util/socket.hpp"
#include "rdzv_test_util.hpp"

namespace ddp::rdzv::test {
namespace {

uint16_t unused_port() {
  // Bound and closed at once: nothing listens there afterwards.
  net::Socket s = net::listen_tcp("127.0.0.1", 0, 1);
  return net::local_port(s.fd());
}

TEST(RdzvEndpoint, RefusedEndpointFailsAfterConnectTimeoutWithTheError) {
  EndpointStoreOptions o;
  o.endpoint = {"127.0.0.1", unused_port()};
  o.connect_timeout = Millis(600);
  o.token = "";
  try {
    EndpointStore s(o);
    FAIL() << "expected NetworkError";
  } catch (const NetworkError& e) {
    std::string m = e.what();
    EXPECT_NE(
        m.find("cannot reach the rendezvous endpoint 127.0.0.1:" + std::to_string(o.endpoint.port)),
        std::string::npos)
        << m;
    EXPECT_NE(m.find("refused"), std::string::npos) << m;
    EXPECT_NE(m.find("Retried for 0.6 s (connect_timeout)"), std::string::npos) << m;
  }
}

// A store host starved of CPU accepts connections (the kernel does, into the backlog) but
// answers hellos late. connect_timeout bounds only how long a refused endpoint is retried;
// a connection that reached the server waits for its hello reply up to call_timeout. Here
// the server answers nothing until well after connect_timeout (its loop starts late).
TEST(RdzvEndpoint, SlowHelloReplyIsNotAnUnreachableEndpoint) {
  TcpStoreServerOptions so;
  so.host = "127.0.0.1";
  so.port = 0;
  so.token = "";
  TcpStoreServer server(so);  // listening, not yet serving
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    server.start();
  });
  EndpointStoreOptions o;
  o.endpoint = {"127.0.0.1", server.port()};
  o.connect_timeout = Millis(300);
  o.call_timeout = Millis(30000);
  o.token = "";
  std::string error;
  try {
    EndpointStore peer(o);
    peer.store()->set("k", "v");
    EXPECT_EQ(peer.connect_another()->get("k"), "v");
  } catch (const Error& e) {
    error = e.what();
  }
  late.join();
  EXPECT_EQ(error, "");
  server.stop();
}

TEST(RdzvEndpoint, HostServesAndPeersConnect) {
  EndpointStoreOptions host;
  host.endpoint = {"127.0.0.1", 0};
  host.host = true;
  host.token = "";
  EndpointStore h(host);
  ASSERT_TRUE(h.is_host());
  EndpointStoreOptions peer;
  peer.endpoint = {"127.0.0.1", h.port()};
  peer.token = "";
  EndpointStore p(peer);
  EXPECT_FALSE(p.is_host());
  p.store()->set("k", "v");
  EXPECT_EQ(h.store()->get("k"), "v");
  EXPECT_EQ(h.connect_another()->get("k"), "v");
}

TEST(RdzvEndpoint, StrangerWithoutTheTokenCannotJoinOrReadKeys) {
  EndpointStoreOptions host;
  host.endpoint = {"127.0.0.1", 0};
  host.host = true;
  host.token = "right-token";
  EndpointStore h(host);
  RendezvousOptions ro;
  ro.run_id = "secret-job";
  ro.endpoint = host.endpoint;
  ro.hostname = "member";
  ro.local_addr = "127.0.0.1";
  ro.conf.join_timeout = Millis(5000);
  ro.pick_master_port = [] { return 1234; };
  Rendezvous member(ro, h.store());
  member.next_round();

  for (std::optional<std::string> token :
       {std::optional<std::string>(""), std::optional<std::string>("wrong-token")}) {
    EndpointStoreOptions stranger;
    stranger.endpoint = {"127.0.0.1", h.port()};
    stranger.token = token;
    stranger.connect_timeout = Millis(2000);
    try {
      EndpointStore s(stranger);
      // Without auth the handshake may succeed lazily; any read must still fail.
      s.store()->get("rdzv/secret-job/0/world");
      FAIL() << "a stranger read the rendezvous keys";
    } catch (const StoreError& e) {
      std::string m = e.what();
      EXPECT_NE(m.find("refused this node"), std::string::npos) << m;
      EXPECT_NE(m.find("same token"), std::string::npos) << m;
    }
  }
  // The stranger without a token is refused by the server; the one with the wrong token
  // refuses the server's proof and hangs up, which the server counts when it sees the EOF.
  for (int i = 0; i < 1000 && h.server()->num_auth_refusals() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_GE(h.server()->num_auth_refusals(), 2u);
}

// 1024 agents need about 1024 descriptors at the store host (plus its own): warn when the
// limit cannot hold them, naming the numbers and the fix; stay quiet when it can.
TEST(RdzvEndpoint, StoreHostWarnsWhenItsOpenFilesLimitIsTooLow) {
  EXPECT_EQ(store_host_fd_warning(20000, 1024, 1), std::nullopt);
  EXPECT_EQ(store_host_fd_warning(1536, 1024, 1), std::nullopt);
  EXPECT_EQ(store_host_fd_warning(1024, 8, 8), std::nullopt);
  auto warning = store_host_fd_warning(1024, 1024, 1);
  ASSERT_TRUE(warning.has_value());
  EXPECT_NE(warning->find("up to 1024 nodes"), std::string::npos) << *warning;
  EXPECT_NE(warning->find("only 1024 files"), std::string::npos) << *warning;
  EXPECT_NE(warning->find("ulimit -n"), std::string::npos) << *warning;
}

TEST(RdzvEndpoint, LocalHostDetection) {
  EXPECT_TRUE(is_local_host("127.0.0.1"));
  EXPECT_TRUE(is_local_host("localhost"));
  // TEST-NET-2 (RFC 5737) is never assigned to a real interface; nothing is sent.
  EXPECT_FALSE(is_local_host("198.51.100.77"));
}

}  // namespace
}  // namespace ddp::rdzv::test
