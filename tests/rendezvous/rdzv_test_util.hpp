#pragma once
// Helpers for rendezvous tests: a store server on loopback (port 0) and agents as threads,
// each with its own TcpStore connection, as separate nodes would have.

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "ddp/rendezvous/membership_watcher.hpp"
#include "ddp/rendezvous/rendezvous.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/store/tcp_store_server.hpp"

namespace ddp::rdzv::test {

using namespace std::chrono_literals;

class LoopbackStore {
 public:
  explicit LoopbackStore(std::optional<std::string> token = "") {
    TcpStoreServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.token = token;
    server_ = std::make_unique<TcpStoreServer>(o);
    server_->start();
  }
  uint16_t port() const { return server_->port(); }
  std::shared_ptr<TcpStore> connect(std::optional<std::string> token = "") const {
    TcpStoreOptions o;
    o.host = "127.0.0.1";
    o.port = port();
    o.timeout = 20s;
    o.token = std::move(token);
    return std::make_shared<TcpStore>(o);
  }

 private:
  std::unique_ptr<TcpStoreServer> server_;
};

// Options for an agent named host<i> with short timeouts, so failures surface fast.
inline RendezvousOptions agent_options(const LoopbackStore& store, const std::string& run_id,
                                       NodeRange nodes, int index, int local_world_size = 1) {
  RendezvousOptions o;
  o.run_id = run_id;
  o.nodes = nodes;
  o.endpoint = {"127.0.0.1", store.port()};
  o.hostname = "host" + std::to_string(index);
  o.local_addr = "10.0.0." + std::to_string(index);
  o.local_world_size = local_world_size;
  o.conf.join_timeout = 20s;
  o.conf.last_call_timeout = 1s;
  o.conf.close_timeout = 10s;
  o.conf.heartbeat = 100ms;
  o.pick_master_port = [] { return 40000; };
  return o;
}

// Runs next_round on each Rendezvous in its own thread and returns the results in order.
inline std::vector<RoundInfo> rounds_in_parallel(std::vector<std::unique_ptr<Rendezvous>>& agents) {
  std::vector<std::future<RoundInfo>> futures;
  for (auto& a : agents) {
    futures.push_back(std::async(std::launch::async, [&a] { return a->next_round(); }));
  }
  std::vector<RoundInfo> out;
  for (auto& f : futures) out.push_back(f.get());
  return out;
}

}  // namespace ddp::rdzv::test
