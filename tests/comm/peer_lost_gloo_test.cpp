// notify_peer_lost (in-place recovery's notice) ends a Gloo call in flight whose peer is alive
// but never joins it: a node cut off without its sockets closing, or a rank that moved on.
// Gloo's calls do not poll the group's abort; before, such a call waited out the group timeout
// (a survivor of recovery.zero_step_lost_node sat 60 s in a ZeRO all_gather_v). Ranks are
// threads, each on a host of its own, so the "cpu" backend runs its cross-host Gloo path too.
#include <gtest/gtest.h>

#include <array>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/init.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/util/error.hpp"

namespace ddp {
namespace {

constexpr int kGlooRanks = 3;
// Far beyond the test's run time: a call that ends must have been ended by the notice.
constexpr std::chrono::minutes kBeyondTheTest{5};

std::vector<ProcessGroupPtr> form_gloo_groups(const std::string& backend) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(kBeyondTheTest);
  std::vector<ProcessGroupPtr> groups(kGlooRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kGlooRanks; ++r) {
    threads.emplace_back([&, r] {
      InitOptions o;
      o.backend = backend;
      o.timeout = kBeyondTheTest;
      o.rank = r;
      o.world_size = kGlooRanks;
      o.store = store;
      o.host_id = "host" + std::to_string(r);
      groups[r] = init_process_group(o);
    });
  }
  for (auto& t : threads) t.join();
  return groups;
}

class PeerLostOnGloo : public ::testing::TestWithParam<std::string> {};

TEST_P(PeerLostOnGloo, TheNoticeEndsACallThatALivePeerNeverJoins) {
  std::vector<ProcessGroupPtr> groups = form_gloo_groups(GetParam());
  // Ranks 0 and 1 gather; rank 2 is alive, its connections open, and never joins. Large
  // enough to run on each group's worker thread, not inline (DDP_CPU_INLINE_BYTES).
  constexpr size_t kCount = 64 * 1024;
  std::array<std::vector<float>, 2> in{std::vector<float>(kCount, 1.0f),
                                       std::vector<float>(kCount, 2.0f)};
  std::array<std::vector<float>, 2> out{std::vector<float>(kCount * kGlooRanks),
                                        std::vector<float>(kCount * kGlooRanks)};
  std::array<WorkPtr, 2> works;
  for (int r = 0; r < 2; ++r) {
    works[r] = groups[r]->all_gather(in[r].data(), out[r].data(), kCount, DataType::kFloat32);
  }
  // Lets each group's worker enter the call (a call still queued would fail at the notice too,
  // without Gloo: the check below then proves less, never a false failure).
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (int r = 0; r < 2; ++r) ASSERT_FALSE(works[r]->is_completed()) << "rank " << r;

  const PeerLostError cause("rank 2 of 3 was lost (test)", 2, 1);
  for (int r = 0; r < 2; ++r) groups[r]->notify_peer_lost(cause);
  for (int r = 0; r < 2; ++r) {
    try {
      works[r]->wait(kBeyondTheTest);
      ADD_FAILURE() << "rank " << r << ": the gather completed without rank 2";
    } catch (const PeerLostError& e) {
      EXPECT_EQ(e.lost_rank(), 2) << "rank " << r;
      EXPECT_EQ(e.generation(), 1) << "rank " << r;
    }
  }
}

// A point-to-point recv whose sender is alive and never sends: the notice ends it with its
// cause, like a collective (the Work keeps a copy: it may outlive its group).
TEST_P(PeerLostOnGloo, TheNoticeEndsARecvFromALivePeerThatNeverSends) {
  std::vector<ProcessGroupPtr> groups = form_gloo_groups(GetParam());
  float value = 0.0f;
  WorkPtr recv = groups[0]->recv(&value, 1, DataType::kFloat32, /*src=*/2, /*tag=*/7);
  groups[0]->notify_peer_lost(PeerLostError("rank 2 of 3 was lost (test)", 2, 1));
  try {
    recv->wait(kBeyondTheTest);
    ADD_FAILURE() << "the recv completed though rank 2 never sent";
  } catch (const PeerLostError& e) {
    EXPECT_EQ(e.lost_rank(), 2);
  }
}

// A recv from any source is Gloo's context's, not one connection's: shutting the connections
// down did not end it (it waited for the group timeout); the notice aborts its wait. Both the
// wait in flight when the notice comes and one that starts after it end.
TEST_P(PeerLostOnGloo, TheNoticeEndsARecvFromAnySource) {
  std::vector<ProcessGroupPtr> groups = form_gloo_groups(GetParam());
  float in_flight_value = 0.0f;
  float later_value = 0.0f;
  WorkPtr in_flight = groups[0]->recv_any_source(&in_flight_value, 1, DataType::kFloat32,
                                                 /*tag=*/7, std::make_shared<int>(-1));
  WorkPtr waited_later = groups[0]->recv_any_source(&later_value, 1, DataType::kFloat32,
                                                    /*tag=*/8, std::make_shared<int>(-1));
  std::exception_ptr in_flight_error;
  std::thread waiter([&] {
    try {
      in_flight->wait(kBeyondTheTest);
    } catch (...) {
      in_flight_error = std::current_exception();
    }
  });
  // Lets the waiter block in Gloo's wait (if it had not yet, the check below proves less,
  // never a false failure: the abort also ends a wait that starts after it).
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  groups[0]->notify_peer_lost(PeerLostError("rank 1 of 3 was lost (test)", 1, 1));
  waiter.join();
  ASSERT_TRUE(in_flight_error) << "the recv completed though no rank sent";
  EXPECT_THROW(std::rethrow_exception(in_flight_error), PeerLostError);
  EXPECT_THROW(waited_later->wait(kBeyondTheTest), PeerLostError);
}

INSTANTIATE_TEST_SUITE_P(Backends, PeerLostOnGloo, ::testing::Values("gloo", "cpu"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ddp
