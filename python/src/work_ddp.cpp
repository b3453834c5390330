#include "work_ddp.hpp"

#include <ATen/core/ivalue.h>
#include <ATen/core/jit_type.h>
#include <c10/core/Event.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <fmt/format.h>

#include <algorithm>

#include "ddp/util/error.hpp"

namespace ddp::python {

namespace {
TimeoutError not_issued_error(std::chrono::milliseconds limit) {
  return TimeoutError(fmt::format(
      "ddp backend: an operation was still waiting to be issued after {} ms, queued behind "
      "earlier operations of its group whose futures' callbacks had not finished (a callback "
      "that waits for a later future, or a peer that stopped)",
      limit.count()));
}
}  // namespace

WorkDDP::WorkDDP(int rank, c10d::OpType type, std::function<void()> epilogue,
                 std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
                 std::weak_ptr<Completer> completer)
    : c10d::Work(rank, type),
      epilogue_(std::move(epilogue)),
      outputs_(std::move(outputs)),
      timeout_(timeout),
      completer_(std::move(completer)) {}

void WorkDDP::issue(const Start& start) {
  auto inner = start();
  {
    std::lock_guard<std::mutex> lock(future_mutex_);
    inner_ = std::move(inner);
    issued_ = true;
  }
  issued_cv_.notify_all();
}

void WorkDDP::defer(Start start) {
  std::lock_guard<std::mutex> lock(future_mutex_);
  deferred_start_ = std::move(start);
}

bool WorkDDP::issue_deferred() {
  Start start;
  {
    std::lock_guard<std::mutex> lock(future_mutex_);
    if (issued_) return future_ != nullptr;
    start = std::move(deferred_start_);
  }
  std::exception_ptr err;
  std::vector<ddp::WorkPtr> inner;
  try {
    if (start) inner = start();
  } catch (...) {
    err = std::current_exception();
  }
  bool wants_future;
  {
    std::lock_guard<std::mutex> lock(future_mutex_);
    inner_ = std::move(inner);
    issued_ = true;
    // Decided with the lock held: a getFuture() after this sees issued_ and watches the Work
    // itself; one before it left future_ for the completer to complete.
    wants_future = future_ != nullptr;
  }
  issued_cv_.notify_all();
  if (err) {
    complete(err);  // fails the Work and its future, if any
    return false;
  }
  return wants_future;
}

bool WorkDDP::is_issued() {
  std::lock_guard<std::mutex> lock(future_mutex_);
  return issued_;
}

bool WorkDDP::wait_issued(std::chrono::milliseconds limit) {
  std::unique_lock<std::mutex> lock(future_mutex_);
  return issued_cv_.wait_for(lock, limit, [&] { return issued_ || done_; });
}

bool WorkDDP::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(future_mutex_);
    if (done_) return true;
    if (!issued_) return false;
  }
  for (auto& w : inner_) {
    if (!w->is_completed()) return false;
  }
  // Everything finished: collect errors, run the epilogue. Not the future's callbacks: this
  // may be any thread (the training thread polling its in-flight operations), and only the
  // future's owner runs them, in issue order.
  finish_work(wait_inner());
  return true;
}

int WorkDDP::sourceRank() const {
  if (!source_) return c10d::Work::sourceRank();
  return *source_;  // written before the ddp Work completed, which completed this one
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
  // A callback waiting for an operation (it issued, or an earlier one) waits in ddp, not in
  // user code: the rescue must not fire meanwhile.
  auto completer = completer_.lock();
  if (completer && !completer->is_current_thread()) completer.reset();
  if (completer) completer->enter_ddp_wait();
  struct Leave {
    Completer* c;
    ~Leave() {
      if (c) c->leave_ddp_wait();
    }
  } leave{completer.get()};
  if (!wait_issued(limit)) throw not_issued_error(limit);
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
  finish_work(err);  // the future's callbacks are its owner's to run (see finish_work)
  // Also before a failure is thrown: a failed collective's kernel may still run (an aborted
  // non-blocking communicator's), and the caller frees or reuses its tensors on its stream.
  order_current_stream();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (exception_) std::rethrow_exception(exception_);
  }
  return true;
}

void WorkDDP::order_current_stream() const {
  if (!stream_) return;
  // torch's Work.wait() on CUDA tensors orders the waiter's current stream: if that is not the
  // stream the operation was issued from (where its results were written), order it after it.
  const c10::impl::VirtualGuardImpl streams(stream_->device_type());
  const c10::Stream current = streams.getStream(stream_->device());
  if (current == *stream_) return;
  c10::Event written(stream_->device_type());
  written.record(*stream_);
  written.block(current);
}

std::exception_ptr WorkDDP::wait_inner() {
  if (!wait_issued(timeout_)) return std::make_exception_ptr(not_issued_error(timeout_));
  std::exception_ptr err;
  for (auto& w : inner_) {
    try {
      w->wait(timeout_);
    } catch (...) {
      if (!err) err = std::current_exception();
    }
  }
  return err;
}

void WorkDDP::wait_and_complete() {
  complete(wait_inner());
}

void WorkDDP::finish_work(std::exception_ptr err) {
  std::call_once(finish_once_, [&] {
    if (!err && epilogue_) {
      try {
        c10::OptionalStreamGuard on_callers_stream(stream_);
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
    }
    finish(err);  // c10d::Work: completed_, exception_, wakes its waiters
  });
}

void WorkDDP::mark_future() {
  c10::intrusive_ptr<c10::ivalue::Future> future;
  std::exception_ptr err;
  {
    std::lock_guard<std::mutex> lock(future_mutex_);
    if (!future_ || !done_ || future_marked_) return;
    future_marked_ = true;
    future = future_;
    err = error_;
  }
  // Outside every lock: marking a future runs its callbacks (DDP's hooks) right here, and a
  // callback may wait on this very Work.
  c10::OptionalStreamGuard on_callers_stream(stream_);
  if (err) {
    future->setError(err);
  } else {
    future->markCompleted(c10::IValue(outputs_));
  }
}

void WorkDDP::complete(std::exception_ptr err) {
  finish_work(std::move(err));
  mark_future();
}

namespace {
// The distinct non-CPU devices of `tensors`, in first-seen order (empty for CPU tensors).
std::vector<c10::Device> devices_of(const std::vector<at::Tensor>& tensors) {
  std::vector<c10::Device> devices;
  for (const auto& t : tensors) {
    if (!t.defined() || t.is_cpu()) continue;
    if (std::find(devices.begin(), devices.end(), t.device()) == devices.end()) {
      devices.push_back(t.device());
    }
  }
  return devices;
}
}  // namespace

c10::intrusive_ptr<c10::ivalue::Future> WorkDDP::getFuture() {
  bool finished = isCompleted();
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(future_mutex_);
    if (future_) return future_;
    // A future over CUDA outputs names their devices, as torch's own backends do: completing
    // it then records an event on the completing thread's stream, and its waiters and
    // callbacks (DDP's comm hooks) order their streams after it.
    future_ = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::TensorType::get()), devices_of(outputs_));
    future = future_;
    finished = done_;
    // Deferred and not issued yet: the completer, which holds it queued, completes it.
    if (!issued_ && !done_) return future;
  }
  if (finished) {
    mark_future();  // finished before the future existed, so it is ours to mark
  } else if (auto completer = completer_.lock(); completer && !completer->is_current_thread()) {
    completer->watch(c10::intrusive_ptr<WorkDDP>::reclaim_copy(this));
  } else if (completer) {
    // Asked from a future's callback on a completer thread (which cannot wait for itself):
    // complete here. The operation itself runs on ddp's worker thread.
    completer->complete_inline(*this);
  } else {
    wait_and_complete();  // the group is gone
  }
  return future;
}

namespace {
// The Completer whose thread this is, if any.
thread_local const Completer* current_completer = nullptr;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

namespace {
// Every live Completer, for quiesce_all_for_exit.
std::mutex registry_mutex;
std::vector<Completer*>& registry() {
  static auto* completers = new std::vector<Completer*>;  // never destroyed: used at exit
  return *completers;
}
}  // namespace

Completer::Completer() {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry().push_back(this);
}

void Completer::quiesce_all_for_exit(std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::lock_guard<std::mutex> registry_lock(registry_mutex);
  for (Completer* c : registry()) {
    std::unique_lock<std::mutex> lock(c->mutex_);
    c->exiting_ = true;
    c->cv_.wait_until(lock, deadline, [&] { return c->processing_ == 0; });
  }
}

Completer::~Completer() {
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto& all = registry();
    all.erase(std::remove(all.begin(), all.end(), this), all.end());
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (watchdog_.joinable()) watchdog_.join();
}

void Completer::start_threads() {
  if (!thread_.joinable()) {
    thread_ = std::thread([this] { loop(); });
    watchdog_ = std::thread([this] { watchdog_loop(); });
  }
}

void Completer::watch(c10::intrusive_ptr<WorkDDP> work) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({std::move(work), now_ns()});
    start_threads();
  }
  cv_.notify_all();
}

bool Completer::defer_if_busy(const c10::intrusive_ptr<WorkDDP>& work, WorkDDP::Start& start,
                              bool always) {
  if (is_current_thread()) return false;  // a callback's operation goes out at once
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!always && queue_.empty() && processing_ == 0) return false;
    work->defer(std::move(start));
    queue_.push_back({work, now_ns()});
    start_threads();
  }
  cv_.notify_all();
  return true;
}

void Completer::process(WorkDDP& work) {
  if (!work.is_issued() && !work.issue_deferred()) return;  // nobody waits on its future yet
  std::exception_ptr err = work.wait_inner();
  user_code_since_ns_ = now_ns();
  in_user_code_ = true;
  work.complete(err);  // runs the future's callbacks
  in_user_code_ = false;
}

void Completer::complete_inline(WorkDDP& work) {
  enter_ddp_wait();
  std::exception_ptr err = work.wait_inner();
  leave_ddp_wait();
  user_code_since_ns_ = now_ns();  // back in the caller's callback after this completes
  work.complete(err);
}

bool Completer::is_current_thread() const {
  return current_completer == this;
}

bool Completer::stuck_in_user_code(const Queued& front) const {
  const int64_t since = user_code_since_ns_;
  return in_user_code_ && ddp_waits_ == 0 && front.since_ns < since &&
         now_ns() - since >
             std::chrono::duration_cast<std::chrono::nanoseconds>(kRescueAfter).count();
}

void Completer::loop() {
  current_completer = this;
  for (;;) {
    c10::intrusive_ptr<WorkDDP> work;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      cv_.wait(lock, [&] { return stop_ || (!exiting_ && !queue_.empty()); });
      if (queue_.empty() || exiting_) return;  // stop_ and nothing left, or the process exits
      work = std::move(queue_.front().work);
      queue_.pop_front();
      ++processing_;
    }
    process(*work);
    work.reset();  // before it counts as processed: dropping it may release Python objects
    {
      std::lock_guard<std::mutex> lock(mutex_);
      --processing_;
    }
    cv_.notify_all();  // quiesce_all_for_exit waits for processing_ == 0
  }
}

void Completer::watchdog_loop() {
  current_completer = this;
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait_for(lock, kRescueAfter / 5);
    if ((stop_ && queue_.empty()) || exiting_) return;
    if (queue_.empty() || !stuck_in_user_code(queue_.front())) continue;
    // The in-order thread waits in a callback, perhaps for this one: complete it.
    c10::intrusive_ptr<WorkDDP> work = std::move(queue_.front().work);
    queue_.pop_front();
    ++processing_;
    lock.unlock();
    if (!warned_rescue_) {
      warned_rescue_ = true;
      fmt::print(stderr,
                 "ddp backend: a future's callback ran for {} s outside ddp's waits (it waits "
                 "for a later operation's future, or is slow): completing queued operations "
                 "of its group without it, so they may be issued in a different order than on "
                 "other ranks; a callback should not wait for an operation issued after its "
                 "own\n",
                 std::chrono::duration_cast<std::chrono::seconds>(kRescueAfter).count());
    }
    if (work->is_issued() || work->issue_deferred()) work->wait_and_complete();
    work.reset();
    lock.lock();
    --processing_;
    cv_.notify_all();
  }
}

}  // namespace ddp::python
