#pragma once
// BoundWork: a wait on a collective of PyTorch's own backends (gloo, nccl) that ddprun's notice
// of a lost rank can end first (python/ddp/torch_generations.py, PendingWaits).
//
// Its future completes with the first of: the source Work's own completion (its value or its
// error), or fail(message). Whichever comes second does nothing. The source's callback is C++
// and touches no Python object, so a collective of a lost generation that ends late (its peer's
// sockets closing at last, maybe while the interpreter finalizes) takes no GIL: a Python
// callback there made the exiting worker abort ("terminate called after throwing an instance
// of 'gloo::IoException'": Python ends a thread that takes the GIL during finalization, and
// that thread was gloo's, unwinding through noexcept frames).

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <string>

namespace ddp::python {

class BoundWork : public c10d::Work {
 public:
  // Binds `source` (its future must exist: PyTorch's gloo and nccl Works give one).
  explicit BoundWork(const c10::intrusive_ptr<c10d::Work>& source);

  // Fails the future with `message` (a RuntimeError in Python) unless the source completed it
  // first; true when this call ended it. Runs the future's callbacks on the calling thread.
  bool fail(const std::string& message);

  // What PendingWaits uses: the future, and whether it completed (to drop finished bindings).
  // The rest of Work's interface keeps its defaults.
  bool isCompleted() override;
  // Waits for the future (the timeout is the source's: it ends by itself or by fail()).
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return state_->future; }

 private:
  // Shared with the source future's callback, which may run after this Work is gone.
  struct State : c10::intrusive_ptr_target {
    explicit State(c10::intrusive_ptr<c10::ivalue::Future> f) : future(std::move(f)) {}
    std::atomic<bool> claimed{false};  // set by whichever completes the future
    c10::intrusive_ptr<c10::ivalue::Future> future;
  };
  c10::intrusive_ptr<State> state_;
};

}  // namespace ddp::python
