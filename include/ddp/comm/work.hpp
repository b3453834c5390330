#pragma once
// Work: the handle of an asynchronous collective.

#include <chrono>
#include <memory>

namespace ddp {

class Work {
 public:
  virtual ~Work() = default;

  // Blocks until the operation finished. Rethrows the operation's error, if any; throws
  // ddp::TimeoutError naming the collective (and, where known, the ranks that never arrived)
  // when `timeout` passes first.
  virtual void wait(std::chrono::milliseconds timeout) = 0;

  // Whether the operation finished (successfully or not); never blocks.
  virtual bool is_completed() = 0;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace ddp
