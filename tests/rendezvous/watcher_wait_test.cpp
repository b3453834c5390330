// How the membership watcher waits between heartbeats: on a store whose waits can be
// interrupted (etcd) in one wait until the next heartbeat, which stop() and request_end()
// interrupt; on other stores (TCP) in slices of at most 500 ms.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "ddp/rendezvous/membership_watcher.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/store/wait_interrupter.hpp"

namespace ddp::rdzv::test {
namespace {

using namespace std::chrono_literals;
using Millis = std::chrono::milliseconds;

// An in-memory store that records the limit of every wait. `interruptible`: it offers
// InterruptibleWait, whose waits end when interrupted or after at most kCap (a watcher that
// never interrupts them is then seen as kTimedOut, not as a hang).
class RecordingStore : public HashStore, public InterruptibleWait {
 public:
  static constexpr Millis kCap{30000};

  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    record(timeout, std::nullopt);
    HashStore::wait(keys, timeout);
  }
  using Store::wait;

  WaitOutcome wait_interruptibly(const std::vector<std::string>& keys, Millis timeout,
                                 WaitInterrupter& interrupter) override {
    const auto end = std::chrono::steady_clock::now() + std::min(timeout, kCap);
    WaitOutcome outcome = WaitOutcome::kTimedOut;
    while (std::chrono::steady_clock::now() < end) {
      if (check(keys)) {
        outcome = WaitOutcome::kSet;
        break;
      }
      if (interrupter.interrupted()) {
        outcome = WaitOutcome::kInterrupted;
        break;
      }
      std::this_thread::sleep_for(5ms);
    }
    record(timeout, outcome);
    return outcome;
  }

  struct Wait {
    Millis limit;
    std::optional<WaitOutcome> outcome;  // nullopt: Store::wait
  };
  std::vector<Wait> waits() {
    std::lock_guard<std::mutex> lock(mutex_);
    return waits_;
  }

 private:
  void record(Millis limit, std::optional<WaitOutcome> outcome) {
    std::lock_guard<std::mutex> lock(mutex_);
    waits_.push_back({limit, outcome});
  }
  std::mutex mutex_;
  std::vector<Wait> waits_;
};

// The same store without InterruptibleWait (as the TCP store).
class PlainRecordingStore : public Store {
 public:
  void set(const std::string& k, const std::string& v) override { inner_.set(k, v); }
  std::string get(const std::string& k) override { return inner_.get(k); }
  int64_t add(const std::string& k, int64_t d) override { return inner_.add(k, d); }
  std::string compare_set(const std::string& k, const std::string& e,
                          const std::string& d) override {
    return inner_.compare_set(k, e, d);
  }
  bool delete_key(const std::string& k) override { return inner_.delete_key(k); }
  int64_t num_keys() override { return inner_.num_keys(); }
  bool check(const std::vector<std::string>& keys) override { return inner_.check(keys); }
  void wait(const std::vector<std::string>& keys, Millis timeout) override {
    inner_.wait(keys, timeout);
  }
  using Store::wait;
  std::vector<RecordingStore::Wait> waits() { return inner_.waits(); }

 private:
  RecordingStore inner_;  // its Store::wait records; InterruptibleWait is not offered here
};

RendezvousOptions one_node_options(Millis heartbeat) {
  RendezvousOptions o;
  o.run_id = "job";
  o.nodes = {1, 1};
  o.conf.heartbeat = heartbeat;
  return o;
}

RoundInfo one_node_round() {
  RoundInfo r;
  r.node_rank = 0;
  r.num_nodes = 1;
  return r;
}

// Whether the watcher wrote its first heartbeat (then it goes on to wait) within 10 s.
bool first_beat_written(Store& store) {
  for (int i = 0; i < 2000 && !store.check({"rdzv/job/0/hb/0"}); ++i) {
    std::this_thread::sleep_for(5ms);
  }
  return store.check({"rdzv/job/0/hb/0"});
}

template <typename StoreType>
bool wait_for_waits(StoreType& store, size_t count) {
  for (int i = 0; i < 2000 && store.waits().size() < count; ++i) std::this_thread::sleep_for(5ms);
  return store.waits().size() >= count;
}

TEST(WatcherWait, OnAnInterruptibleStoreItWaitsUntilTheNextHeartbeatAndStopInterruptsIt) {
  auto store = std::make_shared<RecordingStore>();
  MembershipWatcher watcher(one_node_options(60s), one_node_round(), store,
                            [](const std::string&) {});
  // The first wait is in progress soon after the watcher's heartbeat key is written.
  ASSERT_TRUE(first_beat_written(*store));
  std::this_thread::sleep_for(50ms);
  watcher.stop();
  auto waits = store->waits();
  ASSERT_EQ(waits.size(), 1u) << "one wait per heartbeat period, not slices";
  EXPECT_GT(waits[0].limit, 50s) << "the wait lasts until the next heartbeat (60 s)";
  ASSERT_TRUE(waits[0].outcome.has_value()) << "the interruptible wait was used";
  EXPECT_EQ(*waits[0].outcome, WaitOutcome::kInterrupted) << "stop() ends the wait";
}

TEST(WatcherWait, RequestEndInterruptsTheWaitAndEndsTheRoundWithItsReason) {
  auto store = std::make_shared<RecordingStore>();
  std::promise<std::string> changed;
  MembershipWatcher watcher(one_node_options(60s), one_node_round(), store,
                            [&](const std::string& reason) { changed.set_value(reason); });
  ASSERT_TRUE(first_beat_written(*store));
  std::this_thread::sleep_for(50ms);
  watcher.request_end("a worker failed on this node");
  auto reason = changed.get_future();
  ASSERT_EQ(reason.wait_for(20s), std::future_status::ready)
      << "request_end() did not end the round (its wait was not interrupted)";
  EXPECT_EQ(reason.get(), "a worker failed on this node");
  for (const auto& w : store->waits()) {
    ASSERT_TRUE(w.outcome.has_value());
    EXPECT_NE(*w.outcome, WaitOutcome::kTimedOut);
  }
}

TEST(WatcherWait, OnAStoreThatCannotBeInterruptedItWaitsInSlicesOfAtMost500Ms) {
  auto store = std::make_shared<PlainRecordingStore>();
  MembershipWatcher watcher(one_node_options(60s), one_node_round(), store,
                            [](const std::string&) {});
  ASSERT_TRUE(wait_for_waits(*store, 9)) << "slices of 5, 10, ... ms up to 500 ms";
  watcher.stop();
  for (const auto& w : store->waits()) {
    EXPECT_LE(w.limit, 500ms);
    EXPECT_FALSE(w.outcome.has_value());
  }
}

}  // namespace
}  // namespace ddp::rdzv::test
