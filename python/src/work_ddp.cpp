#include "work_ddp.hpp"

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>

namespace ddp::python {

WorkDDP::WorkDDP(int rank, c10d::OpType type, std::vector<ddp::WorkPtr> inner,
                 std::function<void()> epilogue, std::vector<at::Tensor> outputs,
                 std::chrono::milliseconds timeout, std::weak_ptr<Completer> completer)
    : c10d::Work(rank, type),
      inner_(std::move(inner)),
      epilogue_(std::move(epilogue)),
      outputs_(std::move(outputs)),
      timeout_(timeout),
      completer_(std::move(completer)) {}

bool WorkDDP::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(future_mutex_);
    if (done_) return true;
  }
  for (auto& w : inner_) {
    if (!w->is_completed()) return false;
  }
  wait_and_complete();  // everything finished: collects errors, runs the epilogue
  return true;
}

bool WorkDDP::isSuccess() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return completed_ && !exception_;
}

std::exception_ptr WorkDDP::exception() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return exception_;
}

std::vector<at::Tensor> WorkDDP::result() {
  return outputs_;
}

bool WorkDDP::wait(std::chrono::milliseconds timeout) {
  const auto limit = timeout == kNoTimeout ? timeout_ : timeout;
  std::exception_ptr err;
  for (auto& w : inner_) {
    try {
      w->wait(limit);
    } catch (...) {
      // Still running: only this wait ran out of time (the operation keeps its own limit).
      if (!w->is_completed()) throw;
      if (!err) err = std::current_exception();
    }
  }
  complete(err);
  std::lock_guard<std::mutex> lock(mutex_);
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

void WorkDDP::wait_and_complete() {
  std::exception_ptr err;
  for (auto& w : inner_) {
    try {
      w->wait(timeout_);
    } catch (...) {
      if (!err) err = std::current_exception();
    }
  }
  complete(err);
}

void WorkDDP::complete(std::exception_ptr err) {
  bool first = false;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  std::call_once(complete_once_, [&] {
    first = true;
    if (!err && epilogue_) {
      try {
        epilogue_();
      } catch (...) {
        err = std::current_exception();
      }
    }
    epilogue_ = nullptr;
    {
      std::lock_guard<std::mutex> lock(future_mutex_);
      done_ = true;
      error_ = err;
      future = future_;
    }
    finish(err);  // c10d::Work: completed_, exception_, wakes its waiters
  });
  // Outside every lock and the once-section: marking a future runs its callbacks (DDP's hooks)
  // right here, and a callback may wait on this very Work.
  if (first && future) {
    if (err) {
      future->setError(err);
    } else {
      future->markCompleted(c10::IValue(outputs_));
    }
  }
}

c10::intrusive_ptr<c10::ivalue::Future> WorkDDP::getFuture() {
  bool finished = isCompleted();
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(future_mutex_);
    if (future_) return future_;
    future_ =
        c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    future = future_;
    finished = done_;
  }
  if (finished) {
    // complete() ran before the future existed, so it is ours to mark.
    if (error_) {
      future->setError(error_);
    } else {
      future->markCompleted(c10::IValue(outputs_));
    }
  } else if (auto completer = completer_.lock(); completer && !completer->is_current_thread()) {
    completer->watch(c10::intrusive_ptr<WorkDDP>::reclaim_copy(this));
  } else {
    // Asked from a future's callback on the completer thread (which cannot wait for itself),
    // or the group is gone: complete here. The operation itself runs on ddp's worker thread.
    wait_and_complete();
  }
  return future;
}

namespace {
// The Completer whose thread this is, if any.
thread_local const Completer* current_completer = nullptr;
}  // namespace

Completer::~Completer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void Completer::watch(c10::intrusive_ptr<WorkDDP> work) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(work));
    // Each queued Work gets a thread of its own that is not running callbacks.
    if (queue_.size() > idle_ && threads_.size() < kMaxThreads) {
      threads_.emplace_back([this] { loop(); });
    }
  }
  cv_.notify_one();
}

bool Completer::is_current_thread() const {
  return current_completer == this;
}

void Completer::loop() {
  current_completer = this;
  for (;;) {
    c10::intrusive_ptr<WorkDDP> work;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ++idle_;
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      --idle_;
      if (queue_.empty()) return;  // stop_ and nothing left
      work = std::move(queue_.front());
      queue_.pop_front();
    }
    work->wait_and_complete();
  }
}

}  // namespace ddp::python
