#pragma once
// Test helper: runs `world` ranks as threads of this process, each with its own process group
// on one shared HashStore, and rethrows the first rank's exception in the calling thread.

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/init.hpp"
#include "ddp/store/hash_store.hpp"

namespace ddp::test {

// Waits for `w` with the tests' 60 s limit (a hang fails the test instead of stalling ctest).
inline void wait(const WorkPtr& w) {
  w->wait(std::chrono::seconds(60));
}

inline InitOptions thread_options(const std::string& backend,
                                  std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  InitOptions o;
  o.backend = backend;
  o.timeout = timeout;
  return o;
}

// fn(pg) runs on each rank's thread.
// customize(rank, options) may adjust each rank's options (e.g. host_id) before init.
inline void run_ranks(int world, const InitOptions& base,
                      const std::function<void(ProcessGroup& pg)>& fn,
                      const std::function<void(int, InitOptions&)>& customize = {}) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(base.timeout);
  std::mutex mutex;
  std::exception_ptr first;
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        InitOptions o = base;
        o.rank = r;
        o.world_size = world;
        o.store = store;
        if (customize) customize(r, o);
        ProcessGroupPtr pg = init_process_group(o);
        fn(*pg);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex);
        if (!first) first = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  if (first) std::rethrow_exception(first);
}

// Like run_ranks, but hands each rank's exception message back instead of rethrowing.
inline std::vector<std::string> run_ranks_collect_errors(
    int world, const InitOptions& base, const std::function<void(ProcessGroup& pg)>& fn,
    const std::function<void(int, InitOptions&)>& customize = {}) {
  std::vector<std::string> errors(world);
  run_ranks(
      world, base,
      [&](ProcessGroup& pg) {
        try {
          fn(pg);
        } catch (const std::exception& e) {
          errors[pg.rank()] = e.what();
        }
      },
      customize);
  return errors;
}

}  // namespace ddp::test
