// 4096 clients connected at once, each doing one add: the epoll server holds them all and the
// counter ends at exactly 4096.
#include <gtest/gtest.h>

#include <thread>

#include "store_test_util.hpp"

namespace ddp::test {
namespace {

constexpr int kClients = 4096;
constexpr int kThreads = 8;

TEST(TcpStoreScaleTest, FourThousandNinetySixConcurrentClientsEachAddOnce) {
  // Client and server sockets both live in this process.
  uint64_t limit = net::raise_fd_limit();
  if (limit < 2 * kClients + 256) {
    GTEST_SKIP() << "open-files limit is " << limit << ", need " << 2 * kClients + 256 << " for "
                 << kClients << " clients and their server sockets in one process "
                 << "(raise it with ulimit -n)";
  }
  auto server = start_server();
  std::vector<std::unique_ptr<TcpStore>> clients(kClients);
  std::vector<int64_t> results(kClients, 0);
  auto for_each_client = [&](auto&& body) {
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        for (int i = t; i < kClients; i += kThreads) body(i);
      });
    }
    for (auto& th : threads) th.join();
  };
  // Phase 1: every client connects and stays connected.
  for_each_client(
      [&](int i) { clients[i] = std::make_unique<TcpStore>(client_options(server->port(), 60s)); });
  TcpStore checker(client_options(server->port(), 60s));
  checker.ping();
  EXPECT_EQ(server->num_connections(), static_cast<size_t>(kClients + 1));
  // Phase 2: each adds once while all are open.
  for_each_client([&](int i) { results[i] = clients[i]->add("count", 1); });
  EXPECT_EQ(checker.get("count"), std::to_string(kClients));
  // Every intermediate value was handed out exactly once (adds are atomic).
  std::sort(results.begin(), results.end());
  for (int i = 0; i < kClients; ++i) ASSERT_EQ(results[i], i + 1);
}

}  // namespace
}  // namespace ddp::test
