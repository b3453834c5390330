#pragma once
// Test helper: runs `world` ranks as threads of this process, each with its own "cpu" process
// group over one shared HashStore. Exceptions are collected per rank.

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/init.hpp"
#include "ddp/store/hash_store.hpp"

namespace ddp::test {

// Per rank: the exception it threw, or null.
// `timeout`: the store's and every group's.
inline std::vector<std::exception_ptr> run_ranks_collect(
    int world, const std::function<void(int rank, ProcessGroupPtr pg)>& fn,
    std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(timeout);
  std::vector<std::exception_ptr> errors(world);
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        InitOptions opts;
        opts.backend = "cpu";
        opts.rank = r;
        opts.world_size = world;
        opts.store = store;
        opts.timeout = timeout;
        fn(r, init_process_group(opts));
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

// As run_ranks_collect, rethrowing the first rank's exception.
inline void run_ranks(int world, const std::function<void(int rank, ProcessGroupPtr pg)>& fn) {
  for (auto& e : run_ranks_collect(world, fn)) {
    if (e) std::rethrow_exception(e);
  }
}

inline std::string message_of(const std::exception_ptr& e) {
  if (!e) return "";
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  }
  return "non-std exception";
}

}  // namespace ddp::test
