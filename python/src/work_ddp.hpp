#pragma once
// WorkDDP: the c10d Work the ddp backend returns. It wraps one or more ddp Works (one
// operation may be several ddp calls, e.g. an uneven all_to_all made of sends and receives)
// and an epilogue that runs once they all finished (copying staged results back into
// non-contiguous outputs, unpacking gathered blocks).
//
// Completion is observed lazily: wait() and isCompleted() poll the ddp Works themselves, and
// only a Work whose future was asked for (getFuture(), as DDP's reducer and comm hooks do) is
// handed to the group's Completer, a thread that waits for it and completes the future.
// Works that finished before getFuture() (small operations run inline) complete their
// future at once, without any thread hand-off.

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "ddp/comm/work.hpp"

namespace ddp::python {

class Completer;

class WorkDDP : public c10d::Work {
 public:
  WorkDDP(int rank, c10d::OpType type, std::vector<ddp::WorkPtr> inner,
          std::function<void()> epilogue, std::vector<at::Tensor> outputs,
          std::chrono::milliseconds timeout, std::weak_ptr<Completer> completer);

  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  std::vector<at::Tensor> result() override;
  void synchronize() override {}
  // kNoTimeout (0) waits up to the group's timeout.
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;

  // Waits for the ddp Works (up to the group timeout) and completes; the Completer's job.
  void wait_and_complete();

 private:
  friend class Completer;
  // The ddp Works' first error after waiting for all of them (up to the group timeout).
  std::exception_ptr wait_inner();
  // Runs the epilogue (unless err), marks this Work (and its future, if any) finished. Only
  // the first call has an effect.
  void complete(std::exception_ptr err);

  std::vector<ddp::WorkPtr> inner_;
  std::function<void()> epilogue_;
  std::vector<at::Tensor> outputs_;
  std::chrono::milliseconds timeout_;
  std::weak_ptr<Completer> completer_;

  std::once_flag complete_once_;
  std::mutex future_mutex_;
  bool done_ = false;  // guarded by future_mutex_
  std::exception_ptr error_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Completes the futures of Works (getFuture) of one process group, in issue order, on one
// thread: a future's completion runs its callbacks, and callbacks that issue collectives
// (PowerSGD's hook) must issue them in the same order on every rank.
//
// A callback may also wait for a later future (`f1.then(lambda _: f2.wait())`), which the
// in-order thread would only complete after that callback: a deadlock. So a watchdog thread
// completes queued Works itself while the in-order thread has been in user code (a callback,
// outside any wait of ddp's own) for kRescueAfter. Only then may futures complete out of
// order; PowerSGD's callbacks wait inside ddp's own waits (complete_inline) and never trigger
// it.
class Completer {
 public:
  Completer() = default;
  ~Completer();  // finishes the queued Works (each bounded by the group timeout), then joins
  void watch(c10::intrusive_ptr<WorkDDP> work);
  // Completes `work` on the calling completer thread (a future asked for inside a callback:
  // queueing it behind the running callback would deadlock).
  void complete_inline(WorkDDP& work);
  // Whether the caller is one of this completer's threads (running a future's callback).
  bool is_current_thread() const;

 private:
  static constexpr std::chrono::milliseconds kRescueAfter{2000};
  void loop();
  void watchdog_loop();
  // The in-order thread ran callbacks outside ddp's waits for kRescueAfter.
  bool stuck_in_user_code() const;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<WorkDDP>> queue_;
  bool stop_ = false;
  std::thread thread_;
  std::thread watchdog_;
  std::atomic<bool> in_user_code_{false};
  std::atomic<int> ddp_waits_{0};  // complete_inline waits in progress on completer threads
  std::atomic<int64_t> user_code_since_ns_{0};
};

}  // namespace ddp::python
