// WorkDDP and its Completer (python/src/work_ddp.*) without Python: who runs a future's
// callbacks. Callbacks may issue collectives, so they must run on the group's completer in
// issue order, never on whichever thread happened to notice a Work finished. And who issues an
// operation whose inputs are still being copied (overlapped host staging): the completer, so
// that the caller goes on, with the caller's later operations queued behind it.
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "work_ddp.hpp"

namespace {

using namespace std::chrono_literals;
using ddp::python::Completer;
using ddp::python::WorkDDP;

// A ddp Work the test finishes by hand. is_completed() turns true at finish(); wait() returns
// then on the thread that made it, but holds every other thread (the completer) until
// release(): the completer has not yet seen the Work finish while the test's thread has.
class GatedWork : public ddp::Work {
 public:
  void finish() { finished_ = true; }
  void release() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      released_ = true;
    }
    cv_.notify_all();
  }
  void wait(std::chrono::milliseconds timeout) override {
    if (finished_ && std::this_thread::get_id() == owner_) return;
    std::unique_lock<std::mutex> lock(mutex_);
    if (!cv_.wait_for(lock, timeout, [&] { return released_; })) {
      throw std::runtime_error("GatedWork: not released");
    }
  }
  bool is_completed() override { return finished_; }

 private:
  const std::thread::id owner_ = std::this_thread::get_id();
  std::atomic<bool> finished_{false};
  std::mutex mutex_;
  std::condition_variable cv_;
  bool released_ = false;
};

TEST(WorkDDPFuture, AThreadThatFindsAWatchedWorkFinishedLeavesItsCallbacksToTheCompleter) {
  auto completer = std::make_shared<Completer>();
  auto inner = std::make_shared<GatedWork>();
  auto work = c10::make_intrusive<WorkDDP>(0, c10d::OpType::ALLREDUCE, nullptr,
                                           std::vector<at::Tensor>{}, 30s, completer);
  work->issue([&] { return std::vector<ddp::WorkPtr>{inner}; });
  auto future = work->getFuture();  // handed to the completer, which waits in inner->wait()
  std::promise<std::thread::id> ran_on;
  future->addCallback([&](c10::ivalue::Future&) { ran_on.set_value(std::this_thread::get_id()); });

  inner->finish();
  // The training thread polls its operations in flight (as ProcessGroupDDP does when issuing
  // the next one): the Work is finished, and its callback must not run here.
  EXPECT_TRUE(work->isCompleted());
  EXPECT_FALSE(future->completed()) << "isCompleted() ran the future's callbacks on its caller";

  inner->release();
  auto ran = ran_on.get_future();
  ASSERT_EQ(ran.wait_for(30s), std::future_status::ready) << "the completer never ran it";
  EXPECT_NE(ran.get(), std::this_thread::get_id());
  EXPECT_TRUE(future->completed());
  EXPECT_FALSE(future->hasError());
}

TEST(WorkDDPFuture, AFutureAskedForAfterTheWorkFinishedCompletesAtOnce) {
  auto completer = std::make_shared<Completer>();
  auto inner = std::make_shared<GatedWork>();
  inner->finish();
  inner->release();
  auto work = c10::make_intrusive<WorkDDP>(0, c10d::OpType::ALLREDUCE, nullptr,
                                           std::vector<at::Tensor>{}, 30s, completer);
  work->issue([&] { return std::vector<ddp::WorkPtr>{inner}; });
  EXPECT_TRUE(work->isCompleted());
  auto future = work->getFuture();
  EXPECT_TRUE(future->completed());  // no thread hand-off for a Work finished already
  EXPECT_FALSE(future->hasError());
}

TEST(WorkDDPIssue, AnOperationDeferredAlwaysIsIssuedByTheCompleterAndKeepsTheOrder) {
  auto completer = std::make_shared<Completer>();
  std::promise<void> copies_ended;  // what the staged operation's start waits for
  auto copied = copies_ended.get_future().share();
  std::mutex order_mutex;
  std::vector<int> order;
  std::thread::id staged_issuer;
  auto make = [&] {
    return c10::make_intrusive<WorkDDP>(0, c10d::OpType::ALLREDUCE, nullptr,
                                        std::vector<at::Tensor>{}, 30s, completer);
  };
  auto finished_inner = [] {
    auto inner = std::make_shared<GatedWork>();
    inner->finish();
    inner->release();
    return inner;
  };
  auto staged = make();
  WorkDDP::Start staged_start = [&] {
    copied.wait();
    std::lock_guard<std::mutex> lock(order_mutex);
    order.push_back(1);
    staged_issuer = std::this_thread::get_id();
    return std::vector<ddp::WorkPtr>{finished_inner()};
  };
  // Nothing queued: only `always` defers it. The caller is not held by its start.
  ASSERT_TRUE(completer->defer_if_busy(staged, staged_start, /*always=*/true));
  auto next = make();
  WorkDDP::Start next_start = [&] {
    std::lock_guard<std::mutex> lock(order_mutex);
    order.push_back(2);
    return std::vector<ddp::WorkPtr>{finished_inner()};
  };
  // The caller's next operation (no staging of its own) queues behind it.
  ASSERT_TRUE(completer->defer_if_busy(next, next_start));
  copies_ended.set_value();
  EXPECT_TRUE(next->wait(30s));
  EXPECT_TRUE(staged->wait(30s));
  EXPECT_EQ(order, (std::vector<int>{1, 2}));
  EXPECT_NE(staged_issuer, std::this_thread::get_id());
}

}  // namespace
