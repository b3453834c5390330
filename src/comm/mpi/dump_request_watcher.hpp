#pragma once
// DumpRequestWatcher: makes an MPI rank write its flight record when ddprun asks (the dump
// signal, ddp/util/dump_signal.hpp), even while the rank is stuck in its own code rather than
// in a collective. MPI groups have no store, so the signal is the only way to ask: the thread
// polls the process-wide signal count every kInterval and, when it changed since the watcher
// started, calls `dump` once and stops. The destructor stops and joins the thread (bounded by
// one interval).

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace ddp::mpi_detail {

class DumpRequestWatcher {
 public:
  static constexpr std::chrono::milliseconds kInterval{200};

  // Installs the dump signal's handler (only over the default disposition) and starts the
  // thread. `dump` runs on the watcher's thread and must not throw.
  explicit DumpRequestWatcher(std::function<void()> dump);
  ~DumpRequestWatcher();
  DumpRequestWatcher(const DumpRequestWatcher&) = delete;
  DumpRequestWatcher& operator=(const DumpRequestWatcher&) = delete;

 private:
  void loop(uint64_t signals_seen);

  std::function<void()> dump_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ddp::mpi_detail
