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
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

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

// One thread per process group completing the futures of Works in issue order (collectives
// of a group finish in issue order, so waiting on them in turn costs nothing extra).
class Completer {
 public:
  Completer() = default;
  ~Completer();  // finishes the queued Works (each bounded by the group timeout), then joins

  void watch(c10::intrusive_ptr<WorkDDP> work);

  // Whether the caller is the completer thread (running a future's callback). A callback that
  // issues an operation and waits for its future (PowerSGD's hook does) must not queue that
  // future behind itself.
  bool is_current_thread() const;

 private:
  void loop();

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<c10::intrusive_ptr<WorkDDP>> queue_;
  bool stop_ = false;
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};
};

}  // namespace ddp::python
