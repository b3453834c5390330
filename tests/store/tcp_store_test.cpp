// TcpStore client/server behaviour beyond the common Store operations: connecting, timeouts
// and their messages, waits woken or abandoned, the in-process server.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <thread>

#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"
#include "store_test_util.hpp"

namespace ddp::test {
namespace {

// A port nobody listens on: bind port 0, read the port, close.
uint16_t unused_port() {
  net::Socket sock = net::listen_tcp("127.0.0.1", 0, 1);
  return net::local_port(sock.fd());
}

std::string endpoint_of(uint16_t port) {
  return "127.0.0.1:" + std::to_string(port);
}

// ddprun --standalone's store port: below the ephemeral range, where no outgoing connection
// can take it before the store binds it, and free.
TEST(FreeTcpPort, IsBelowTheEphemeralRangeAndFree) {
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int low = 0, high = 0;
  ASSERT_TRUE(range >> low >> high) << "no /proc/sys/net/ipv4/ip_local_port_range";
  for (int i = 0; i < 20; ++i) {
    const uint16_t port = net::free_tcp_port("");
    if (low - 10000 >= 1000) {
      EXPECT_GE(port, 10000);
      EXPECT_LT(port, std::min(low, 20000));
    }
    EXPECT_NO_THROW(net::listen_tcp("", port, 1)) << "port " << port;
  }
}

TEST(TcpStoreTest, GetTimeoutMessageNamesEndpointKeyAndLimit) {
  auto server = start_server();
  TcpStore client(client_options(server->port()));
  try {
    client.get("rank7/ready", 80ms);
    FAIL() << "get returned without the key";
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(endpoint_of(server->port())), std::string::npos) << what;
    EXPECT_NE(what.find("rank7/ready"), std::string::npos) << what;
    EXPECT_NE(what.find("limit 80 ms"), std::string::npos) << what;
    EXPECT_NE(what.find("timed out after"), std::string::npos) << what;
  }
  // The connection stays usable after a server-side timeout.
  client.set("after", "ok");
  EXPECT_EQ(client.get("after"), "ok");
}

// milliseconds::max() means "no limit": get and wait block until the key arrives instead of
// overflowing the deadline into an immediate TimeoutError. A store whose own timeout is max()
// connects and serves as usual.
TEST(TcpStoreTest, WaitsWithoutLimitReturnWhenTheKeyArrives) {
  auto server = start_server();
  TcpStore waiter(client_options(server->port(), std::chrono::milliseconds::max()));
  TcpStore setter(client_options(server->port()));
  std::string got;
  std::string error;
  std::thread blocked([&] {
    try {
      waiter.wait({"late/1"}, std::chrono::milliseconds::max());
      got = waiter.get("late/2", std::chrono::milliseconds::max());
      got += "," + waiter.get("late/3");  // the store's own timeout, max() too
    } catch (const Error& e) {
      error = e.what();
    }
  });
  std::this_thread::sleep_for(50ms);
  setter.set("late/1", "a");
  std::this_thread::sleep_for(20ms);
  setter.set("late/2", "b");
  setter.set("late/3", "c");
  blocked.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(got, "b,c");
}

TEST(TcpStoreTest, ConnectionRefusedAfterTimeoutSaysSoWithTheAddress) {
  uint16_t port = unused_port();
  try {
    TcpStore client(client_options(port, 200ms));
    FAIL() << "connected to a port nobody listens on";
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find(endpoint_of(port)), std::string::npos) << what;
    EXPECT_NE(what.find("Connection refused"), std::string::npos) << what;
    EXPECT_NE(what.find("limit 200 ms"), std::string::npos) << what;
  }
}

TEST(TcpStoreTest, ClientRetriesUntilTheServerStartsListening) {
  // Reserve a port, release it, and start the server on it only after the client has begun
  // retrying. (Another process could grab the port in between; then the server constructor
  // throws and the test reports it.)
  uint16_t port = unused_port();
  std::atomic<bool> connected{false};
  std::string value;
  std::thread client_thread([&] {
    TcpStore client(client_options(port, 30s));
    connected = true;
    value = client.get("hello");
  });
  std::this_thread::sleep_for(100ms);
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  options.token = "";
  TcpStoreServer server(options);
  server.start();
  TcpStore setter(client_options(port));
  setter.set("hello", "world");
  client_thread.join();
  EXPECT_TRUE(connected);
  EXPECT_EQ(value, "world");
}

TEST(TcpStoreTest, BlockingGetIsWokenByASetFromAnotherClient) {
  auto server = start_server();
  TcpStore waiter(client_options(server->port()));
  TcpStore setter(client_options(server->port()));
  // The set may land before or after the get parks on the server; both must deliver. (The
  // disconnect and timeout tests exercise the parked path deterministically.)
  std::thread t([&] { setter.set("go", "1"); });
  EXPECT_EQ(waiter.get("go"), "1");
  t.join();
  // Multiple waiters on one key are all woken.
  std::vector<std::unique_ptr<TcpStore>> clients;
  std::vector<std::thread> threads;
  std::atomic<int> woken{0};
  for (int i = 0; i < 8; ++i) {
    clients.push_back(std::make_unique<TcpStore>(client_options(server->port())));
  }
  for (auto& c : clients) {
    threads.emplace_back([&, client = c.get()] {
      client->wait({"barrier"}, 10s);
      ++woken;
    });
  }
  setter.set("barrier", "open");
  for (auto& th : threads) th.join();
  EXPECT_EQ(woken.load(), 8);
}

TEST(TcpStoreTest, WaitOnSeveralKeysSurvivesDeleteAndReset) {
  auto server = start_server();
  TcpStore waiter(client_options(server->port()));
  TcpStore other(client_options(server->port()));
  other.set("a", "1");
  other.delete_key("a");
  std::thread t([&] {
    other.set("b", "2");
    other.set("a", "3");
  });
  waiter.wait({"a", "b"}, 10s);
  t.join();
  EXPECT_EQ(waiter.multi_get({"a", "b"}), (std::vector<std::string>{"3", "2"}));
}

// Issue 49, finding 4: a wait on K keys, then one multi_set of them. Each set rescanned the
// waiter's K keys on the server's only thread: O(K^2), 58 s for 20,000 keys, and the loop
// answered nobody meanwhile. Now each set counts the waiter down. With 50,000 keys the old
// server is still busy when the multi_set's limit (60 s) ends, and the call fails.
TEST(TcpStoreTest, AWaitOnManyKeysIsReleasedByOneMultiSetWithoutFreezingTheServer) {
  constexpr int kKeys = 50000;
  auto server = start_server();
  TcpStore waiter(client_options(server->port(), std::chrono::seconds(60)));
  TcpStore setter(client_options(server->port(), std::chrono::seconds(60)));
  std::vector<std::string> keys, values;
  for (int i = 0; i < kKeys; ++i) {
    keys.push_back("k" + std::to_string(i));
    values.push_back(std::to_string(i));
  }
  std::exception_ptr wait_error;
  std::thread t([&] {
    try {
      waiter.wait(keys, std::chrono::seconds(60));
    } catch (...) {
      wait_error = std::current_exception();
    }
  });
  // The wait must be parked before the keys arrive, or nothing is counted down.
  for (int i = 0; i < 6000 && server->num_waiting() == 0; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_EQ(server->num_waiting(), 1u) << "the wait was not parked within 60 s";
  std::exception_ptr set_error;
  try {
    setter.multi_set(keys, values);
  } catch (...) {
    set_error = std::current_exception();
  }
  t.join();  // the wait ends too: released, or at its own 60 s limit
  if (set_error) std::rethrow_exception(set_error);
  if (wait_error) std::rethrow_exception(wait_error);
  EXPECT_EQ(server->num_waiting(), 0u);
  EXPECT_EQ(setter.get("k49999"), "49999");
}

TEST(TcpStoreTest, ClientThatDisconnectsWhileWaitingDoesNotDisturbOthers) {
  auto server = start_server();
  {
    // A raw client parks a wait, then vanishes.
    auto sock = raw_connect(server->port());
    raw_send(sock, encode(store_protocol::Op::kHello, {"raw"}));
    EXPECT_EQ(raw_read_frame(sock).op, store_protocol::Op::kOk);
    raw_send(sock, encode(store_protocol::Op::kWait,
                          {store_protocol::encode_i64(60000), "never-set"}, 2));
  }
  TcpStore good(client_options(server->port()));
  good.set("never-set", "now set");  // wakes nobody: the waiter's connection is gone
  EXPECT_EQ(good.get("never-set"), "now set");
  EXPECT_EQ(good.add("n", 1), 1);
  // The server has dropped the dead connection (only `good` remains) once it noticed EOF;
  // a ping round trip orders us after that.
  good.ping();
  EXPECT_EQ(server->num_connections(), 1u);
}

TEST(TcpStoreTest, ConcurrentCallsOnOneClientAreSerialised) {
  auto server = start_server();
  TcpStore client(client_options(server->port()));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 100; ++i) client.add("counter", 1);
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(client.add("counter", 0), 400);
}

TEST(TcpStoreTest, IsServerHostsTheStoreOnAFreePort) {
  TcpStoreOptions options = client_options(0);
  options.is_server = true;
  TcpStore host(options);
  ASSERT_NE(host.port(), 0);
  ASSERT_NE(host.server(), nullptr);
  TcpStore worker(client_options(host.port()));
  worker.set("from-worker", "hi");
  EXPECT_EQ(host.get("from-worker"), "hi");
}

TEST(TcpStoreTest, CallsAfterTheServerStopsFailWithTheEndpoint) {
  auto server = start_server();
  uint16_t port = server->port();
  TcpStore client(client_options(port, 300ms));
  client.set("k", "v");
  server->stop();
  try {
    client.get("k");
    FAIL() << "get succeeded against a stopped server";
  } catch (const Error& e) {
    // Either the dead connection (NetworkError) or the failed reconnect (TimeoutError).
    std::string what = e.what();
    EXPECT_NE(what.find(endpoint_of(port)), std::string::npos) << what;
  }
}

TEST(TcpStoreTest, ServerOnABusyPortExplainsTheFix) {
  auto server = start_server();
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = server->port();
  try {
    TcpStoreServer second(options);
    FAIL() << "two servers bound one port";
  } catch (const NetworkError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("address already in use"), std::string::npos) << what;
    EXPECT_NE(what.find(endpoint_of(server->port())), std::string::npos) << what;
  }
}

TEST(TcpStoreTest, ServerStopsCleanlyWithClientsAttachedAndWaiting) {
  auto server = start_server();
  TcpStore client(client_options(server->port(), 30s));
  std::thread waiter([&] { EXPECT_THROW(client.get("never", 30s), Error); });
  // stop() must not wait for the 30 s wait; the parked client sees its connection close.
  std::this_thread::sleep_for(50ms);
  server->stop();
  waiter.join();
}

}  // namespace
}  // namespace ddp::test
