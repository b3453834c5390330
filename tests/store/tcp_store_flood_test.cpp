// Connection floods: peers that open connections and never complete the handshake must not
// exhaust the server's descriptors or lock real clients out (issue 25, defect 10). The server
// keeps at most max_handshakes_per_address connections per peer address, and
// max_handshakes in total, in the handshake; authenticated connections do not count.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <functional>
#include <thread>

#include "ddp/util/error.hpp"
#include "store_test_util.hpp"

namespace ddp::test {
namespace {

const size_t kPerAddressCap = TcpStoreServerOptions::kDefaultMaxHandshakesPerAddress;
const size_t kTotalCap = TcpStoreServerOptions::kDefaultMaxHandshakes;

// A server whose handshake timeout outlasts the test, so only the caps can close the flood.
std::unique_ptr<TcpStoreServer> start_flood_target() {
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.token = std::string("s3cret");
  options.handshake_timeout = 120s;
  auto server = std::make_unique<TcpStoreServer>(options);
  server->start();
  return server;
}

// A raw connection to 127.0.0.1:port from `source`: on Linux all of 127.0.0.0/8 is this host,
// so one process can pose as several peer addresses.
net::Socket connect_from(const std::string& source, uint16_t port) {
  net::Socket sock(::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  sockaddr_in from{};
  from.sin_family = AF_INET;
  inet_pton(AF_INET, source.c_str(), &from.sin_addr);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(port);
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  if (!sock.valid() || ::bind(sock.fd(), reinterpret_cast<sockaddr*>(&from), sizeof(from)) != 0) {
    throw NetworkError("cannot bind a test socket to " + source + ": " + std::strerror(errno));
  }
  if (::connect(sock.fd(), reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0 &&
      errno != EINPROGRESS) {
    throw NetworkError("cannot connect from " + source + ": " + std::strerror(errno));
  }
  pollfd pfd{sock.fd(), POLLOUT, 0};
  int error = 0;
  socklen_t len = sizeof(error);
  if (::poll(&pfd, 1, 10000) != 1 ||
      ::getsockopt(sock.fd(), SOL_SOCKET, SO_ERROR, &error, &len) != 0 || error != 0) {
    throw NetworkError("cannot connect from " + source + " within 10 s");
  }
  return sock;
}

// How many of `socks` the server has closed: a read returns EOF. The flood never sends, so the
// server's close is a FIN, never a reset.
size_t count_closed(const std::vector<net::Socket>& socks) {
  size_t closed = 0;
  for (const auto& sock : socks) {
    char byte;
    if (::recv(sock.fd(), &byte, 1, MSG_DONTWAIT | MSG_PEEK) == 0) ++closed;
  }
  return closed;
}

// Polls `done` every 10 ms until it holds or `limit` passes; returns whether it held.
bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  auto deadline = net::Clock::now() + limit;
  while (!done()) {
    if (net::Clock::now() >= deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

TEST(TcpStoreFloodTest, FloodFromOneAddressIsCappedAndAnAgentThereStillJoins) {
  LogCapture capture;
  auto server = start_flood_target();
  constexpr size_t kExcess = 16;
  std::vector<net::Socket> flood;
  for (size_t i = 0; i < kPerAddressCap + kExcess; ++i)
    flood.push_back(raw_connect(server->port()));
  // The excess is closed at once: the flood is younger than the age at which one of its
  // connections would be evicted in favour of a newcomer.
  size_t closed = 0;
  EXPECT_TRUE(wait_until([&] { return (closed = count_closed(flood)) >= kExcess; }, 10s))
      << closed << " of " << flood.size() << " closed; expected " << kExcess;
  EXPECT_TRUE(wait_until([&] { return server->num_connections() <= kPerAddressCap; }, 10s))
      << server->num_connections() << " connections open, cap " << kPerAddressCap;
  EXPECT_EQ(count_closed(flood), kExcess);

  // A real client from the same address gets in once the flood's connections are old enough to
  // give way (it retries meanwhile), authenticates, and works.
  TcpStore agent(client_options(server->port(), 30s, std::string("s3cret")));
  agent.set("k", "v");
  EXPECT_EQ(agent.get("k"), "v");
  EXPECT_LE(server->num_connections(), kPerAddressCap + 1);
  std::string log = capture.text();
  EXPECT_NE(log.find("max_handshakes_per_address = " + std::to_string(kPerAddressCap)),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("127.0.0.1:"), std::string::npos) << log;
}

TEST(TcpStoreFloodTest, FloodFromManyAddressesIsCappedInTotalAndAgentsStillJoin) {
  constexpr size_t kAddresses = 17;  // 17 x 64 > 1024: only the total cap stops this flood
  constexpr size_t kAgents = 8;
  const size_t flood_size = kAddresses * kPerAddressCap;
  uint64_t fd_limit = net::raise_fd_limit();
  if (fd_limit < 2 * flood_size + 256) {
    GTEST_SKIP() << "open-files limit is " << fd_limit << ", need " << 2 * flood_size + 256;
  }
  LogCapture capture;
  auto server = start_flood_target();
  // Authenticated before the flood: the caps must not touch them.
  std::vector<std::unique_ptr<TcpStore>> agents;
  for (size_t i = 0; i < kAgents; ++i) {
    agents.push_back(
        std::make_unique<TcpStore>(client_options(server->port(), 30s, std::string("s3cret"))));
  }
  std::vector<net::Socket> flood;
  for (size_t a = 0; a < kAddresses; ++a) {
    std::string source = "127.0.0." + std::to_string(2 + a);
    for (size_t i = 0; i < kPerAddressCap; ++i)
      flood.push_back(connect_from(source, server->port()));
  }
  // The server never holds more than the cap in the handshake: the rest wait unaccepted, then
  // each displaces one of the oldest (which the server closes).
  size_t most = 0;
  size_t closed = 0;
  EXPECT_TRUE(wait_until(
      [&] {
        most = std::max(most, server->num_connections());
        return (closed = count_closed(flood)) >= flood_size - kTotalCap;
      },
      10s))
      << closed << " of " << flood.size() << " closed; expected at least "
      << flood_size - kTotalCap;
  EXPECT_LE(most, kTotalCap + kAgents);

  TcpStore late(client_options(server->port(), 30s, std::string("s3cret")));
  late.set("late", "1");
  for (size_t i = 0; i < kAgents; ++i) {
    agents[i]->set("k" + std::to_string(i), "v");
    EXPECT_EQ(agents[i]->get("late"), "1");
  }
  EXPECT_LE(server->num_connections(), kTotalCap + kAgents + 1);
  std::string log = capture.text();
  EXPECT_NE(log.find("max_handshakes = " + std::to_string(kTotalCap)), std::string::npos) << log;
}

TEST(TcpStoreFloodTest, ZeroCapIsAUsageErrorNamingTheOption) {
  TcpStoreServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  options.max_handshakes_per_address = 0;
  try {
    TcpStoreServer server(options);
    FAIL() << "a server that could admit no client was created";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("max_handshakes_per_address (0)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddp::test
