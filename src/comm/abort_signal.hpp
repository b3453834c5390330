#pragma once
// AbortSignal: how a process group tells its blocking waits to give up early (internal header).
//
// raise() stores the error once (the first caller wins) and then sets the flag; a wait that
// sees raised() (it polls the flag at least every 100 ms, futex_wait.hpp) ends and rethrows the
// stored error. Used by ProcessGroup::notify_peer_lost (in-place recovery, docs/recovery.md).

#include <atomic>
#include <exception>
#include <mutex>

namespace ddp::detail {

class AbortSignal {
 public:
  // Returns false when an earlier raise() already won.
  bool raise(std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (raised_.load(std::memory_order_relaxed)) return false;
    error_ = std::move(error);
    raised_.store(true, std::memory_order_release);
    return true;
  }
  bool raised() const { return raised_.load(std::memory_order_acquire); }
  const std::atomic<bool>* flag() const { return &raised_; }
  // The stored error; only after raised() returned true.
  std::exception_ptr error() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }
  [[noreturn]] void rethrow() const { std::rethrow_exception(error()); }

 private:
  mutable std::mutex mutex_;
  std::atomic<bool> raised_{false};
  std::exception_ptr error_;
};

}  // namespace ddp::detail
