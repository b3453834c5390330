#pragma once
// FutureWork: the Work every backend in this folder returns. The executing thread calls
// finish() once; wait() blocks on a condition variable bounded by the caller's timeout.

#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <string>

#include "ddp/comm/work.hpp"

namespace ddp::detail {

class FutureWork : public Work {
 public:
  // `what` names the operation in a timeout message ("all_reduce(float32, count=4, sum) #2 on
  // rank 0 of 2 (backend cpu)").
  explicit FutureWork(std::string what) : what_(std::move(what)) {}

  void wait(std::chrono::milliseconds timeout) override;
  bool is_completed() override;

  // Marks the work finished; `error` (may be null) is rethrown by every wait().
  void finish(std::exception_ptr error);

 private:
  std::string what_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

}  // namespace ddp::detail
