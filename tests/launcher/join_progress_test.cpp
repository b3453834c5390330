// The lines of a node waiting for the rendezvous (join_progress.hpp): their exact wording, the
// count of arrived nodes read from a store, and the reporter thread's start, ticks and stop.

#include "ddp/launcher/join_progress.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ddp/rendezvous/rendezvous.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/util/error.hpp"

using namespace ddp::launcher;
using ddp::rdzv::Millis;

namespace {

JoinWait static_wait(bool serves_store, int node_rank) {
  JoinWait w;
  w.backend = ddp::rdzv::Backend::kStatic;
  w.run_id = "job7";
  w.endpoint = "10.0.0.1:29501";
  w.serves_store = serves_store;
  w.node_rank = node_rank;
  w.nodes = {2, 2};
  w.limit = Millis(600000);
  return w;
}

TEST(JoinProgressText, StartLineNamesTheStoreTheLimitAndTheInterval) {
  EXPECT_EQ(format_join_start(static_wait(true, 0), Millis(30000)),
            "waiting for the other nodes of static run 'job7' (2 nodes): the rendezvous store is "
            "10.0.0.1:29501, served by this node (node rank 0); giving up after 600 s "
            "(--rdzv-conf join_timeout=SECONDS); a progress line every 30 s");
  JoinWait c10d = static_wait(false, -1);
  c10d.backend = ddp::rdzv::Backend::kC10d;
  c10d.nodes = {2, 4};
  c10d.limit = Millis(2500);
  EXPECT_EQ(format_join_start(c10d, Millis(500)),
            "waiting for the other nodes of c10d run 'job7' (2 to 4 nodes): the rendezvous store "
            "is 10.0.0.1:29501, served by the ddprun at that address; giving up after 2.5 s "
            "(--rdzv-conf join_timeout=SECONDS); a progress line every 0.5 s");
}

TEST(JoinProgressText, ProgressLineCountsArrivalsOrSaysWhyNot) {
  JoinCount count;
  count.arrived = 1;
  count.expected = 2;
  count.missing = {1};
  EXPECT_EQ(format_join_progress(static_wait(true, 0), Millis(30012), count, "ignored"),
            "still waiting for the other nodes of static run 'job7': 1 of 2 nodes arrived "
            "(missing: node rank 1) at the rendezvous store 10.0.0.1:29501, served by this node "
            "(node rank 0); waited 30 s, giving up after 600 s (--rdzv-conf join_timeout=SECONDS)");
  EXPECT_EQ(format_join_progress(static_wait(false, 1), Millis(1500), std::nullopt, "no count"),
            "still waiting for the other nodes of static run 'job7' (2 nodes; no count) at the "
            "rendezvous store 10.0.0.1:29501, served by the ddprun at that address (this is node "
            "rank 1); waited 1.5 s, giving up after 600 s (--rdzv-conf join_timeout=SECONDS)");

  // Long lists of missing ranks are cut.
  JoinWait big = static_wait(true, 0);
  big.nodes = {12, 12};
  count.arrived = 2;
  count.expected = 12;
  count.missing = {1, 2, 3, 4, 5, 6, 7, 8, 9, 11};
  EXPECT_NE(format_join_progress(big, Millis(60000), count, "")
                .find(": 2 of 12 nodes arrived (missing: node ranks 1, 2, 3, 4, 5, 6, 7, 8 and 2 "
                      "more) at"),
            std::string::npos);
}

TEST(JoinProgressCount, CountsTheStaticNodesInTheStore) {
  auto store = std::make_shared<ddp::HashStore>();
  ddp::rdzv::RendezvousOptions o;
  o.backend = ddp::rdzv::Backend::kStatic;
  o.run_id = "job7";
  o.nodes = {3, 3};
  o.endpoint = {"127.0.0.1", 29501};
  o.hostname = "host1";
  o.local_addr = "10.0.0.2";
  o.node_rank = 1;
  o.conf.join_timeout = Millis(50);
  // Node 1 arrives alone and gives up at once; its entry in round 0 stays in the store.
  EXPECT_THROW(ddp::rdzv::Rendezvous(o, store).next_round(), ddp::rdzv::RendezvousTimeoutError);

  auto count = count_static_arrivals(store, o, 0);
  ASSERT_TRUE(count.has_value());
  EXPECT_EQ(count->arrived, 1);
  EXPECT_EQ(count->expected, 3);
  EXPECT_EQ(count->missing, (std::vector<int>{0, 2}));
  // A round that does not list the asking node is not the one it joined: no count.
  EXPECT_FALSE(count_static_arrivals(store, o, 1).has_value());
  o.node_rank = 0;
  EXPECT_FALSE(count_static_arrivals(store, o, 0).has_value());
}

// Collects the lines the reporter writes.
struct Lines {
  std::mutex mutex;
  std::condition_variable added;
  std::vector<std::string> lines;

  void add(const std::string& line) {
    std::lock_guard<std::mutex> lock(mutex);
    lines.push_back(line);
    added.notify_all();
  }
  // Bounded wait for at least n lines; the lines so far.
  std::vector<std::string> wait_for(size_t n) {
    std::unique_lock<std::mutex> lock(mutex);
    added.wait_for(lock, std::chrono::seconds(20), [&] { return lines.size() >= n; });
    return lines;
  }
};

TEST(JoinProgressReporter, StartsAtOnceTicksAndStopsWhenDestroyed) {
  Lines out;
  size_t written = 0;
  {
    int calls = 0;
    JoinProgress::Counter counter;
    counter.count = [&calls]() -> std::optional<JoinCount> {
      if (++calls == 2) throw ddp::NetworkError("connection refused");
      JoinCount c;
      c.arrived = 1;
      c.expected = 2;
      c.missing = {1};
      return c;
    };
    JoinProgress progress(static_wait(true, 0), Millis(20), counter,
                          [&out](const std::string& line) { out.add(line); });
    std::vector<std::string> lines = out.wait_for(3);
    ASSERT_GE(lines.size(), 3u);
    EXPECT_EQ(lines[0].rfind("waiting for the other nodes of static run 'job7' (2 nodes)", 0), 0u)
        << lines[0];
    EXPECT_NE(lines[1].find(": 1 of 2 nodes arrived (missing: node rank 1) at"), std::string::npos)
        << lines[1];
    EXPECT_NE(lines[2].find("(2 nodes; could not count them: connection refused) at"),
              std::string::npos)
        << lines[2];
  }
  {
    std::lock_guard<std::mutex> lock(out.mutex);
    written = out.lines.size();
  }
  // The destructor returned: the reporter has stopped, and writes nothing more.
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  std::lock_guard<std::mutex> lock(out.mutex);
  EXPECT_EQ(out.lines.size(), written);
}

}  // namespace
