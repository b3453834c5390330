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
// future at once, without any thread hand-off. wait() and isCompleted() finish a Work (its
// epilogue, its status) but never run a handed-over future's callbacks: those are the
// Completer's, in order (see finish_work).
//
// Issue order. Every rank must hand its group's collectives to ddp in the same order, and a
// future's callback may issue collectives (PowerSGD's hook issues two per bucket from
// callbacks) while the training thread issues the next bucket's. With NCCL a future completes
// when its kernel is queued, so such a callback runs at once, inside the hook; on CPU it runs
// when the data arrived, on the completer thread, racing the training thread: one rank issued
// bucket 1's all_reduce before bucket 0's callback issued its own, another after, and the two
// reduced tensors of different sizes. So an operation issued by any thread other than the
// completer's while the completer has work queued or a callback running is not issued at
// once: it is deferred (the Work is returned, the operation queued) and the completer issues
// it after the callbacks of everything queued before it. Then every rank issues in the
// order "each Work's callbacks right after its completion", whatever the timing, provided a
// callback is attached (then()) before the same thread issues its next operation, as DDP's
// comm hooks do. Operations issued from a callback on the completer thread go out at once.

#include <c10/core/Stream.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "ddp/comm/work.hpp"

namespace ddp::python {

class Completer;

class WorkDDP : public c10d::Work {
 public:
  // Hands the operation to ddp and returns its ddp Works (several for an operation made of
  // sends and receives); throws on misuse or a failed group.
  using Start = std::function<std::vector<ddp::WorkPtr>()>;

  // A Work not issued yet: issue() or defer() follows.
  WorkDDP(int rank, c10d::OpType type, std::function<void()> epilogue,
          std::vector<at::Tensor> outputs, std::chrono::milliseconds timeout,
          std::weak_ptr<Completer> completer);

  // Issues the operation now, on the calling thread; start's exceptions reach the caller.
  void issue(const Start& start);
  // Keeps `start` for the completer, which runs it in order (issue_deferred).
  void defer(Start start);
  // The completer's part of a deferred Work: runs start (its error fails this Work). True
  // when the future was asked for by then: the completer must then wait for and complete it.
  bool issue_deferred();

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

  // An operation on the NCCL lane (nccl_lane.hpp): the caller's CUDA stream it was issued from.
  // The epilogue and the future's completion run with it current, so that the copies back and
  // the future's event order after the collective there (ddp's Work::wait made that stream wait
  // for it), as waiters and callbacks then do. Unset: the thread's own streams (host operations).
  void set_stream(c10::Stream stream) { stream_ = stream; }

  // A recv from any source: where the ddp Work stores the sender's rank.
  void set_source(std::shared_ptr<int> source) { source_ = std::move(source); }
  // The sender of a recv from any source once completed (torch's work._source_rank());
  // c10d's error for other Works.
  int sourceRank() const override;

 private:
  friend class Completer;
  // The ddp Works' first error after waiting for all of them (up to the group timeout).
  std::exception_ptr wait_inner();
  // Waits up to `limit` until the operation was issued (at once unless deferred).
  bool wait_issued(std::chrono::milliseconds limit);
  bool is_issued();
  // Runs the epilogue (unless err) and marks this Work finished; only the first call has an
  // effect. Leaves the future alone: any thread may finish a Work (wait(), isCompleted()), but
  // only its future's owner may run the future's callbacks (mark_future), because callbacks
  // may issue collectives and must run in issue order. (A training thread that ran a queued
  // Work's callbacks inside isCompleted() issued the callback's collective after its own
  // next one, on that rank only.)
  void finish_work(std::exception_ptr err);
  // Marks the future with the finished Work's outcome, running its callbacks on this thread;
  // once, and only after finish_work. The owner's part: the completer (in order), the
  // watchdog's rescue, complete_inline, or getFuture for a Work finished before it.
  void mark_future();
  // finish_work, then mark_future: the owner's way to complete.
  void complete(std::exception_ptr err);
  // At the end of wait(), failed or not: the waiter's current stream on the operation's device
  // waits for the stream it was issued from (nothing for host operations, or when they are the
  // same).
  void order_current_stream() const;

  std::vector<ddp::WorkPtr> inner_;
  std::function<void()> epilogue_;
  std::vector<at::Tensor> outputs_;
  std::chrono::milliseconds timeout_;
  std::weak_ptr<Completer> completer_;

  std::once_flag finish_once_;
  std::mutex future_mutex_;
  std::condition_variable issued_cv_;
  Start deferred_start_;        // guarded by future_mutex_; run by issue_deferred
  bool issued_ = false;         // guarded by future_mutex_; inner_ is set once before it turns true
  bool done_ = false;           // guarded by future_mutex_
  bool future_marked_ = false;  // guarded by future_mutex_
  std::exception_ptr error_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::shared_ptr<int> source_;        // set by the recv from any source, else null
  std::optional<c10::Stream> stream_;  // set_stream, before the Work is issued
};

// Completes the futures of Works (getFuture) of one process group, in issue order, on one
// thread: a future's completion runs its callbacks, and callbacks that issue collectives
// (PowerSGD's hook) must issue them in the same order on every rank.
//
// A callback may also wait for a later future (`f1.then(lambda _: f2.wait())`), which the
// in-order thread would only complete after that callback: a deadlock. So a watchdog thread
// completes queued Works itself while the in-order thread has been in user code (a callback,
// outside any wait of ddp's own) for kRescueAfter. Only then may futures complete out of
// order; PowerSGD's callbacks wait inside ddp's own waits (complete_inline, or Work.wait() on
// an operation they issued) and never trigger it. The limit is long because a rescue that
// fires while a callback is merely slow (a loaded machine, the GIL) issues a deferred
// operation before the one that callback is about to issue, on this rank only: its peers then
// reduce tensors of different sizes (seen at 2 s on a loaded CI machine).
class Completer {
 public:
  Completer();
  // Finishes the queued Works (each bounded by the group timeout; none after
  // quiesce_all_for_exit), then joins.
  ~Completer();
  void watch(c10::intrusive_ptr<WorkDDP> work);
  // Queues `work` (with its deferred start) behind the queued Works when called from a
  // thread other than the completer's while Works are queued or a callback runs (see "Issue
  // order" above), or with `always` from any thread but the completer's; false when it may be
  // issued at once instead.
  bool defer_if_busy(const c10::intrusive_ptr<WorkDDP>& work, WorkDDP::Start& start,
                     bool always = false);
  // Completes `work` on the calling completer thread (a future asked for inside a callback:
  // queueing it behind the running callback would deadlock).
  void complete_inline(WorkDDP& work);
  // Whether the caller is one of this completer's threads (running a future's callback).
  bool is_current_thread() const;
  // Marks a wait of ddp's own (WorkDDP::wait) on this completer's thread, which is not user
  // code stuck on a later future; the waits nest.
  void enter_ddp_wait() { ++ddp_waits_; }
  void leave_ddp_wait() { --ddp_waits_; }

  // Before the interpreter finalizes (atexit, the GIL released): every Completer finishes the
  // callback it runs, if any, waiting at most `limit` in all, and starts no other. A callback
  // left running (or a Python object it drops) would take the GIL while Python finalizes,
  // and Python ends such a thread with pthread_exit, whose unwinding through a destructor
  // aborts the process ("terminate called without an active exception", after a rank's
  // error had already been raised). Queued Works stay unfinished: the process is exiting.
  static void quiesce_all_for_exit(std::chrono::milliseconds limit);

 private:
  struct Queued {
    c10::intrusive_ptr<WorkDDP> work;
    int64_t since_ns = 0;  // when it was queued (now_ns)
  };
  static constexpr std::chrono::milliseconds kRescueAfter{10000};
  void loop();
  void watchdog_loop();
  void start_threads();  // with mutex_ held
  // Issues `work` if it was deferred, then waits for it and completes it (callbacks) unless
  // it was deferred and nobody asked for its future.
  void process(WorkDDP& work);
  // The in-order thread ran callbacks outside ddp's waits for kRescueAfter, and `front` was
  // queued before the running callback started (so that callback may be waiting for it). A
  // Work queued later cannot be what it waits for: rescuing it could only reorder it, e.g.
  // when the watchdog looks in the moment between a callback that just returned (its future
  // waking the caller, who queues more) and the in-order thread leaving user code.
  bool stuck_in_user_code(const Queued& front) const;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Queued> queue_;
  int processing_ = 0;  // Works popped and not yet processed (guarded by mutex_)
  bool stop_ = false;
  bool exiting_ = false;  // guarded by mutex_: quiesce_all_for_exit ran; take no more Works
  std::thread thread_;
  std::thread watchdog_;
  std::atomic<bool> in_user_code_{false};
  std::atomic<int> ddp_waits_{0};  // complete_inline waits in progress on completer threads
  std::atomic<int64_t> user_code_since_ns_{0};
  bool warned_rescue_ = false;  // watchdog thread only
};

}  // namespace ddp::python
