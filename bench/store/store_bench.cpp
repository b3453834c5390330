// Store benchmark: prints one JSON object per line.
//   {"bench":"store_roundtrip","impl":"ddp","op":"set",...}  1 client, loopback, in-process server
//   {"bench":"store_connect_add","impl":"ddp","clients":4096,...}  connect + one add each
// bench/store/run_store_bench.sh runs this next to PyTorch's TCPStore doing the same.
//
// Usage: store_bench [--iters N] [--clients N] [--threads N]
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddp/store/tcp_store.hpp"
#include "ddp/store/tcp_store_server.hpp"
#include "ddp/util/socket.hpp"

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

ddp::TcpStoreOptions client_options(uint16_t port) {
  ddp::TcpStoreOptions options;
  options.host = "127.0.0.1";
  options.port = port;
  options.timeout = std::chrono::seconds(120);
  options.token = "";
  return options;
}

void bench_roundtrips(uint16_t port, int iters) {
  ddp::TcpStore client(client_options(port));
  std::string value(16, 'v');
  for (int i = 0; i < 1000; ++i) client.set("warmup", value);  // connection, caches
  auto start = Clock::now();
  for (int i = 0; i < iters; ++i) client.set("key" + std::to_string(i % 64), value);
  double set_s = seconds_since(start);
  start = Clock::now();
  for (int i = 0; i < iters; ++i) client.get("key" + std::to_string(i % 64));
  double get_s = seconds_since(start);
  for (auto [op, secs] : {std::pair<const char*, double>{"set", set_s}, {"get", get_s}}) {
    fmt::print(
        "{{\"bench\":\"store_roundtrip\",\"impl\":\"ddp\",\"op\":\"{}\",\"iters\":{},"
        "\"value_bytes\":{},\"ops_per_s\":{:.0f},\"us_per_op\":{:.2f}}}\n",
        op, iters, value.size(), iters / secs, secs * 1e6 / iters);
  }
}

void bench_connect_add(uint16_t port, int clients, int threads) {
  std::vector<std::unique_ptr<ddp::TcpStore>> stores(clients);
  auto start = Clock::now();
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      for (int i = t; i < clients; i += threads) {
        stores[i] = std::make_unique<ddp::TcpStore>(client_options(port));
        stores[i]->add("connect_add", 1);
      }
    });
  }
  for (auto& w : workers) w.join();
  double secs = seconds_since(start);
  int64_t total = stores[0]->add("connect_add", 0);
  fmt::print(
      "{{\"bench\":\"store_connect_add\",\"impl\":\"ddp\",\"clients\":{},\"threads\":{},"
      "\"ms\":{:.1f},\"count_ok\":{}}}\n",
      clients, threads, secs * 1e3, total == clients ? "true" : "false");
  // Disconnect before the next run reuses the counter.
  stores.clear();
  ddp::TcpStore(client_options(port)).delete_key("connect_add");
}

int int_arg(int argc, char** argv, const char* name, int fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::atoi(argv[i + 1]);
  }
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  int iters = int_arg(argc, argv, "--iters", 20000);
  int clients = int_arg(argc, argv, "--clients", 4096);
  int threads = int_arg(argc, argv, "--threads", 8);
  try {
    ddp::net::raise_fd_limit();
    ddp::TcpStoreServerOptions options;
    options.host = "127.0.0.1";
    options.port = 0;
    options.token = "";
    ddp::TcpStoreServer server(options);
    server.start();
    bench_roundtrips(server.port(), iters);
    bench_connect_add(server.port(), clients, threads);
    bench_connect_add(server.port(), clients, 1);
  } catch (const std::exception& e) {
    fmt::print(stderr, "store_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
