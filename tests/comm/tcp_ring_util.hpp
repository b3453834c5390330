#pragma once
// Test helpers for TcpRing (the cpu backend's all_reduce among host leaders): rings of n ranks
// as threads over loopback on one HashStore, and the CallInfo their calls need.

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "call_info.hpp"
#include "cpu/tcp_ring.hpp"
#include "ddp/store/hash_store.hpp"

namespace ddp::test {

inline detail::CallInfo call_for(DataType t, ReduceOp op, size_t count) {
  return detail::CallInfo{detail::OpKind::kAllReduce, t, op, true, -1, 0, count, 0, 1};
}

// Ring ranks are 0..n-1, their key prefix "t/", their address 127.0.0.1. Construction errors
// propagate from the rank threads as std::terminate (a test bug, not a ring outcome).
inline std::vector<std::unique_ptr<detail::TcpRing>> make_rings(int n,
                                                                std::chrono::milliseconds timeout) {
  HashStore store;
  std::vector<std::unique_ptr<detail::TcpRing>> rings(n);
  std::vector<std::thread> threads;
  std::vector<int> ranks(n);
  for (int r = 0; r < n; ++r) ranks[r] = r;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      rings[r] = std::make_unique<detail::TcpRing>(store, "t/", r, n, timeout, ranks,
                                                   "ring rank " + std::to_string(r), "127.0.0.1");
    });
  }
  for (auto& t : threads) t.join();
  return rings;
}

}  // namespace ddp::test
