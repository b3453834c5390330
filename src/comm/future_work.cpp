#include "future_work.hpp"

#include <fmt/format.h>

#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"

namespace ddp::detail {

void FutureWork::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  // wait_until a saturated deadline: wait_for(max()) overflows (undefined behaviour).
  if (!done_cv_.wait_until(lock, deadline_after(timeout), [&] { return done_; })) {
    throw TimeoutError(fmt::format(
        "{} did not complete within {} ms; another rank may not have reached this collective "
        "(it keeps running until the group's own timeout)",
        what_, timeout.count()));
  }
  if (error_) std::rethrow_exception(error_);
}

bool FutureWork::is_completed() {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

void FutureWork::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    error_ = std::move(error);
  }
  done_cv_.notify_all();
}

}  // namespace ddp::detail
