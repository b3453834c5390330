#include "bound_work.hpp"

#include <ATen/core/ivalue.h>

#include <stdexcept>
#include <utility>

namespace ddp::python {

BoundWork::BoundWork(const c10::intrusive_ptr<c10d::Work>& source) {
  auto source_future = source->getFuture();
  // Same element type and devices as the source's: a CUDA value completes it as it would the
  // source (its streams' events), not as a CPU future.
  state_ = c10::make_intrusive<State>(c10::make_intrusive<c10::ivalue::Future>(
      source_future->elementType(), source_future->devices()));
  source_future->addCallback([state = state_](c10::ivalue::Future& done) {
    if (state->claimed.exchange(true)) {
      return;  // failed already: nothing waits for this collective any more
    }
    if (done.hasError()) {
      state->future->setError(done.exception_ptr());
    } else {
      state->future->markCompleted(done.value(), done.storages());
    }
  });
}

bool BoundWork::fail(const std::string& message) {
  if (state_->claimed.exchange(true)) {
    return false;
  }
  state_->future->setError(std::make_exception_ptr(std::runtime_error(message)));
  return true;
}

bool BoundWork::isCompleted() {
  return state_->future->completed();
}

bool BoundWork::wait(std::chrono::milliseconds /*timeout*/) {
  state_->future->waitAndThrow();
  return true;
}

}  // namespace ddp::python
