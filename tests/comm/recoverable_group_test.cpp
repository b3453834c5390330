// RecoverableGroup (in-place recovery) with ranks as threads on one HashStore: the collective
// in flight ends with PeerLostError naming the lost rank once the launcher's notice is in the
// store, and the group re-forms in the same "processes" with the replacement rank.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "ddp/comm/recoverable_group.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/store/recovery_notice.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/util/error.hpp"

namespace ddp {
namespace {

constexpr int kWorld = 3;

RecoverableGroupOptions options_for(int rank, const std::shared_ptr<Store>& store,
                                    int world_size = kWorld) {
  RecoverableGroupOptions o;
  o.rank = rank;
  o.world_size = world_size;
  o.store = store;
  // Far beyond the test's run time: a collective that ends must have ended by the notice.
  o.timeout = std::chrono::minutes(5);
  o.watch_interval = std::chrono::milliseconds(20);
  return o;
}

// Destroys `group` while an exception is in flight, as a failing process unwinds: it records no
// finish.
void throw_in_scope(std::unique_ptr<RecoverableGroup> group) {
  try {
    struct Dies {
      std::unique_ptr<RecoverableGroup> group;
    } dies{std::move(group)};
    throw std::runtime_error("killed");
  } catch (const std::runtime_error&) {
  }
}

float all_reduce_one(ProcessGroup& pg, float value) {
  pg.all_reduce(&value, 1, DataType::kFloat32, ReduceOp::kSum)->wait(pg.timeout());
  return value;
}

// While the job changes membership: slot 0 runs a collective the others never join, which ends
// at the notice (its PeerLostError kept in `error`); the others wait until their group is stale.
// Then the group re-forms.
void give_up_at_the_notice_and_reform(RecoverableGroup& group, int slot,
                                      std::optional<PeerLostError>& error) {
  if (slot == 0) {
    try {
      all_reduce_one(*group.group(), 1.0f);
    } catch (const PeerLostError& e) {
      error = e;
    }
  } else {
    while (!group.stale()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  group.reform();
}

TEST(RecoverableGroup, LostMemberAbortsTheCollectiveAndTheGroupReforms) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(std::chrono::minutes(5));
  std::array<std::optional<PeerLostError>, kWorld> lost_errors;
  std::array<float, kWorld> sums{};
  std::array<int64_t, kWorld> generations{};
  std::atomic<int> waiting{0};

  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {  // the survivors
    threads.emplace_back([&, r] {
      RecoverableGroup group(options_for(r, store));
      EXPECT_FALSE(group.stale());
      EXPECT_EQ(all_reduce_one(*group.group(), 1.0f), 3.0f);
      ++waiting;
      try {
        all_reduce_one(*group.group(), 1.0f);  // rank 2 never joins this one
      } catch (const PeerLostError& e) {
        lost_errors[r] = e;
      }
      EXPECT_TRUE(group.stale());
      group.reform();
      generations[r] = group.generation();
      sums[r] = all_reduce_one(*group.group(), static_cast<float>(r + 1));
    });
  }
  // Rank 2's first incarnation: takes part in the first collective, then "dies".
  {
    RecoverableGroup doomed(options_for(2, store));
    EXPECT_EQ(all_reduce_one(*doomed.group(), 1.0f), 3.0f);
  }
  while (waiting.load() < 2) std::this_thread::yield();
  // ddprun's part: record the loss, then restart the rank, which joins the new generation.
  EXPECT_EQ(recovery_notice::publish_lost_rank(*store, 2), 1);
  threads.emplace_back([&] {
    RecoverableGroup replacement(options_for(2, store));
    generations[2] = replacement.generation();
    sums[2] = all_reduce_one(*replacement.group(), 3.0f);
  });
  for (auto& t : threads) t.join();

  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(lost_errors[r].has_value()) << "rank " << r << " got no PeerLostError";
    EXPECT_EQ(lost_errors[r]->lost_rank(), 2);
    EXPECT_EQ(lost_errors[r]->generation(), 1);
    EXPECT_NE(std::string(lost_errors[r]->what()).find("rank 2 of 3 was lost"), std::string::npos)
        << lost_errors[r]->what();
  }
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(generations[r], 1) << "rank " << r;
    EXPECT_EQ(sums[r], 6.0f) << "rank " << r;
  }
}

// A rank that starts while another loss is recorded (two failures at once: a replacement reads
// generation 0, the others move to generation 1) forms the newer generation once forming its
// own times out, as reform() does. Before, its constructor threw the TimeoutError and the
// replacement died with it.
TEST(RecoverableGroup, ARankFormingAnOutdatedGenerationMovesToTheNewest) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(std::chrono::minutes(1));
  auto options = [&](int rank) {
    RecoverableGroupOptions o = options_for(rank, store);
    o.world_size = 2;
    o.timeout = std::chrono::milliseconds(1500);
    return o;
  };
  std::array<int64_t, 2> generations{-1, -1};
  std::array<float, 2> sums{};
  auto run_rank = [&](int rank) {
    try {
      RecoverableGroup group(options(rank));
      generations[rank] = group.generation();
      sums[rank] = all_reduce_one(*group.group(), static_cast<float>(rank + 1));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << rank << ": " << e.what();
    }
  };
  std::thread early(run_rank, 0);  // reads generation 0, which rank 1 never forms
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(recovery_notice::publish_lost_rank(*store, 1), 1);
  std::thread late(run_rank, 1);  // reads generation 1
  early.join();
  late.join();
  EXPECT_EQ(generations[0], 1);
  EXPECT_EQ(generations[1], 1);
  EXPECT_EQ(sums[0], 3.0f);
  EXPECT_EQ(sums[1], 3.0f);
}

// The same with the group's timeout far away: the rank forming the superseded generation sees
// the newer one while it waits (two failures at once on two nodes) and moves on at once, not at
// the timeout.
TEST(RecoverableGroup, ARankFormingASupersededGenerationMovesOnBeforeTheTimeout) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(std::chrono::minutes(5));
  auto form = [&](int rank) {
    RecoverableGroupOptions o = options_for(rank, store, 2);  // timeout: 5 minutes
    RecoverableGroup group(o);
    return std::make_pair(group.generation(),
                          all_reduce_one(*group.group(), static_cast<float>(rank + 1)));
  };
  auto early = std::async(std::launch::async, form, 0);  // generation 0: rank 1 never forms it
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(recovery_notice::publish_lost_rank(*store, 1), 1);
  auto late = std::async(std::launch::async, form, 1);  // generation 1
  // Far below the 5 minute timeout, far above the 20 ms watch interval.
  ASSERT_EQ(early.wait_for(std::chrono::seconds(60)), std::future_status::ready)
      << "rank 0 waited in the superseded generation";
  const auto [g0, sum0] = early.get();
  const auto [g1, sum1] = late.get();
  EXPECT_EQ(g0, 1);
  EXPECT_EQ(g1, 1);
  EXPECT_EQ(sum0, 3.0f);
  EXPECT_EQ(sum1, 3.0f);
}

TEST(RecoverableGroup, LaterOperationsOfAnAbortedGroupFailWithTheSameError) {
  auto store = std::make_shared<HashStore>();
  RecoverableGroupOptions o = options_for(0, store);
  o.world_size = 1;
  RecoverableGroup group(o);
  group.group()->notify_peer_lost(PeerLostError("rank 1 of 2 was lost", 1, 1));
  float x = 1.0f;
  try {
    group.group()
        ->all_reduce(&x, 1, DataType::kFloat32, ReduceOp::kSum)
        ->wait(std::chrono::minutes(1));
    FAIL() << "the aborted group ran a collective";
  } catch (const PeerLostError& e) {
    EXPECT_EQ(e.lost_rank(), 1);
  }
}

// Multi-node --recovery step: every node's agent records its own workers' losses in the same
// store. Concurrent records must open distinct generations with no gap, each lost/<g> set.
TEST(RecoveryNotice, AgentsRecordingLossesAtOnceOpenDistinctGenerationsWithoutGaps) {
  auto store = std::make_shared<HashStore>();
  constexpr int kAgents = 8;
  std::array<int64_t, kAgents> opened{};
  std::vector<std::thread> agents;
  for (int a = 0; a < kAgents; ++a) {
    agents.emplace_back([&, a] { opened[a] = recovery_notice::publish_lost_rank(*store, 10 + a); });
  }
  for (auto& t : agents) t.join();
  EXPECT_EQ(recovery_notice::read_generation(*store), kAgents);
  std::vector<bool> seen(kAgents + 1, false);
  for (int a = 0; a < kAgents; ++a) {
    ASSERT_GE(opened[a], 1);
    ASSERT_LE(opened[a], kAgents);
    EXPECT_FALSE(seen[opened[a]]) << "generation " << opened[a] << " opened twice";
    seen[opened[a]] = true;
    EXPECT_EQ(recovery_notice::read_lost_rank(*store, opened[a]), 10 + a);
  }
}

// A lost node's record takes its slots out of every later generation; in-place restarts keep
// the membership. The membership of a generation follows from the records alone.
TEST(RecoveryNotice, MembersFollowTheRecordsOfLostNodes) {
  HashStore store;
  using V = std::vector<int>;
  EXPECT_EQ(recovery_notice::members(store, 0, 6), (V{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(recovery_notice::publish_lost_rank(store, 1), 1);
  EXPECT_EQ(recovery_notice::members(store, 1, 6), (V{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(recovery_notice::publish_lost_node(store, {2, 3}), 2);
  EXPECT_EQ(recovery_notice::members(store, 2, 6), (V{0, 1, 4, 5}));
  EXPECT_EQ(recovery_notice::read_lost_rank(store, 2), 2);
  EXPECT_EQ(recovery_notice::read_removed_slots(store, 2), (V{2, 3}));
  EXPECT_TRUE(recovery_notice::read_removed_slots(store, 1).empty());
  EXPECT_EQ(recovery_notice::publish_lost_rank(store, 4), 3);
  EXPECT_EQ(recovery_notice::publish_lost_node(store, {5}), 4);
  EXPECT_EQ(recovery_notice::members(store, 4, 6), (V{0, 1, 4}));
  // Earlier generations keep their membership.
  EXPECT_EQ(recovery_notice::members(store, 3, 6), (V{0, 1, 4, 5}));
  EXPECT_THROW(recovery_notice::publish_lost_node(store, {}), UsageError);
  store.set("ddp/recovery/lost/9", "node:2,x");
  EXPECT_THROW(recovery_notice::read_removed_slots(store, 9), ProtocolError);
}

// A node that joins the running job takes back the slots a lost node left: from its record on,
// those slots are members again, in slot order; earlier generations keep their membership.
TEST(RecoveryNotice, AJoinRecordGivesALostNodesSlotsBack) {
  HashStore store;
  using V = std::vector<int>;
  EXPECT_EQ(recovery_notice::publish_lost_node(store, {2, 3}), 1);
  EXPECT_EQ(recovery_notice::publish_joined_node(store, {2, 3}), 2);
  EXPECT_EQ(recovery_notice::members(store, 1, 6), (V{0, 1, 4, 5}));
  EXPECT_EQ(recovery_notice::members(store, 2, 6), (V{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(recovery_notice::read_joined_slots(store, 2), (V{2, 3}));
  EXPECT_TRUE(recovery_notice::read_removed_slots(store, 2).empty());
  EXPECT_TRUE(recovery_notice::read_joined_slots(store, 1).empty());
  // Lost again after coming back.
  EXPECT_EQ(recovery_notice::publish_lost_node(store, {2, 3}), 3);
  EXPECT_EQ(recovery_notice::members(store, 3, 6), (V{0, 1, 4, 5}));
  EXPECT_THROW(recovery_notice::publish_joined_node(store, {}), UsageError);
}

// A node that grows the job past its launch size adds slots from the launch's world size on:
// members from its record on, in slot order after the launch's; lost like any node's.
TEST(RecoveryNotice, AJoinRecordPastTheLaunchSizeGrowsTheJob) {
  HashStore store;
  using V = std::vector<int>;
  EXPECT_EQ(recovery_notice::publish_joined_node(store, {4, 5}), 1);
  EXPECT_EQ(recovery_notice::members(store, 0, 4), (V{0, 1, 2, 3}));
  EXPECT_EQ(recovery_notice::members(store, 1, 4), (V{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(recovery_notice::publish_lost_node(store, {0, 1}), 2);
  EXPECT_EQ(recovery_notice::members(store, 2, 4), (V{2, 3, 4, 5}));
  EXPECT_EQ(recovery_notice::publish_lost_node(store, {4, 5}), 3);
  EXPECT_EQ(recovery_notice::members(store, 3, 4), (V{2, 3}));
  // A later node takes the grown node's place again.
  EXPECT_EQ(recovery_notice::publish_joined_node(store, {4, 5}), 4);
  EXPECT_EQ(recovery_notice::members(store, 4, 4), (V{2, 3, 4, 5}));
  // Every process counts from the launch's world size: slots a grower reserved but never
  // recorded (it died first) are no members.
  EXPECT_EQ(recovery_notice::publish_joined_node(store, {8}), 5);
  EXPECT_EQ(recovery_notice::members(store, 5, 4), (V{2, 3, 4, 5, 8}));
}

// A node that joins with new slots grows the job: the running ranks give up their collective at
// the notice and re-form with the new ones after theirs; the new processes, launched with the
// grown world size and the launch's, join that generation in their slots.
TEST(RecoverableGroup, ANodeJoiningPastTheLaunchSizeGrowsTheGroup) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(std::chrono::minutes(5));
  std::array<std::optional<PeerLostError>, 6> errors;
  std::array<int, 6> ranks{-1, -1, -1, -1, -1, -1}, sizes{}, launch{};
  std::array<float, 6> sums{};
  std::atomic<int> waiting{0};
  std::vector<std::thread> threads;
  for (int slot = 0; slot < 4; ++slot) {  // the launch's 4 ranks
    threads.emplace_back([&, slot] {
      RecoverableGroup group(options_for(slot, store, 4));
      EXPECT_EQ(all_reduce_one(*group.group(), 1.0f), 4.0f);
      ++waiting;
      give_up_at_the_notice_and_reform(group, slot, errors[slot]);
      ranks[slot] = group.rank();
      sizes[slot] = group.world_size();
      launch[slot] = group.launch_world_size();
      sums[slot] = all_reduce_one(*group.group(), 1.0f);
    });
  }
  while (waiting.load() < 4) std::this_thread::yield();
  EXPECT_EQ(recovery_notice::publish_joined_node(*store, {4, 5}), 1);
  for (int slot : {4, 5}) {  // the new node's processes: WORLD_SIZE 6, launched at 4
    threads.emplace_back([&, slot] {
      RecoverableGroupOptions o = options_for(slot, store, 6);
      o.launch_world_size = 4;
      RecoverableGroup group(o);
      ranks[slot] = group.rank();
      sizes[slot] = group.world_size();
      launch[slot] = group.launch_world_size();
      sums[slot] = all_reduce_one(*group.group(), 1.0f);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(errors[0].has_value()) << "slot 0's collective in flight was not given up";
  EXPECT_NE(std::string(errors[0]->what())
                .find("ranks 4,5 joined the job with a node that grew it past its launch size "
                      "of 4"),
            std::string::npos)
      << errors[0]->what();
  for (int slot = 0; slot < 6; ++slot) {
    EXPECT_EQ(ranks[slot], slot);
    EXPECT_EQ(sizes[slot], 6);
    EXPECT_EQ(launch[slot], 4);
    EXPECT_EQ(sums[slot], 6.0f) << "slot " << slot;
  }
}

// A node lost in a multi-node job (ranks 1 and 2 of 4 here): the survivors' collective in
// flight ends with PeerLostError naming the node's ranks, and they re-form as ranks 0 and 1 of
// 2, in slot order. A process of the lost node that comes back finds no place in the job.
TEST(RecoverableGroup, ALostNodesRanksLeaveAndTheSurvivorsReformRenumbered) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(std::chrono::minutes(5));
  auto options = [&](int slot) { return options_for(slot, store, 4); };
  std::array<std::optional<PeerLostError>, 4> lost_errors;
  std::array<int, 4> ranks{-1, -1, -1, -1}, sizes{}, slots{-1, -1, -1, -1};
  std::array<float, 4> sums{};
  std::atomic<int> waiting{0};
  std::vector<std::thread> threads;
  for (int slot : {0, 3}) {  // the survivors
    threads.emplace_back([&, slot] {
      RecoverableGroup group(options(slot));
      EXPECT_EQ(all_reduce_one(*group.group(), 1.0f), 4.0f);
      ++waiting;
      try {
        all_reduce_one(*group.group(), 1.0f);  // slots 1 and 2 never join this one
      } catch (const PeerLostError& e) {
        lost_errors[slot] = e;
      }
      group.reform();
      ranks[slot] = group.rank();
      sizes[slot] = group.world_size();
      slots[slot] = group.slot();
      sums[slot] = all_reduce_one(*group.group(), static_cast<float>(group.rank() + 1));
    });
  }
  for (int slot : {1, 2}) {  // the lost node's ranks: the first collective, then gone
    threads.emplace_back([&, slot] {
      RecoverableGroup doomed(options(slot));
      EXPECT_EQ(all_reduce_one(*doomed.group(), 1.0f), 4.0f);
    });
  }
  while (waiting.load() < 2) std::this_thread::yield();
  threads[2].join();
  threads[3].join();
  EXPECT_EQ(recovery_notice::publish_lost_node(*store, {1, 2}), 1);
  threads[0].join();
  threads[1].join();

  for (int slot : {0, 3}) {
    ASSERT_TRUE(lost_errors[slot].has_value()) << "slot " << slot << " got no PeerLostError";
    EXPECT_EQ(lost_errors[slot]->lost_rank(), 1);
    EXPECT_NE(
        std::string(lost_errors[slot]->what()).find("ranks 1,2 of 4 were lost with their node"),
        std::string::npos)
        << lost_errors[slot]->what();
    EXPECT_EQ(sizes[slot], 2);
    EXPECT_EQ(slots[slot], slot);
    EXPECT_EQ(sums[slot], 3.0f) << "slot " << slot;
  }
  EXPECT_EQ(ranks[0], 0);
  EXPECT_EQ(ranks[3], 1);
  // A process of the lost node (a split healed): no place in generation 1.
  try {
    RecoverableGroup zombie(options(2));
    FAIL() << "slot 2 formed a group after its node was lost";
  } catch (const RemovedFromJobError& e) {
    EXPECT_NE(std::string(e.what()).find("no longer a member of the job"), std::string::npos)
        << e.what();
  }
}

// A node joins after ranks 1 and 2 of 4 were lost with theirs: the survivors' collective in
// flight is given up (the step is redone with the new ranks), they re-form as ranks 0 and 3 of
// 4 again, and the new processes launched in slots 1 and 2 form the same generation.
TEST(RecoverableGroup, ANodeJoiningTakesTheLostSlotsBackAndTheOthersMakeRoom) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(std::chrono::minutes(5));
  auto options = [&](int slot) { return options_for(slot, store, 4); };
  EXPECT_EQ(recovery_notice::publish_lost_node(*store, {1, 2}), 1);
  std::array<std::optional<PeerLostError>, 4> errors;
  std::array<int, 4> ranks{-1, -1, -1, -1}, sizes{};
  std::array<float, 4> sums{};
  std::atomic<int> waiting{0};
  std::vector<std::thread> threads;
  for (int slot : {0, 3}) {  // the survivors, 2 ranks at generation 1
    threads.emplace_back([&, slot] {
      RecoverableGroup group(options(slot));
      EXPECT_EQ(group.world_size(), 2);
      EXPECT_EQ(all_reduce_one(*group.group(), 1.0f), 2.0f);
      ++waiting;
      give_up_at_the_notice_and_reform(group, slot, errors[slot]);
      ranks[slot] = group.rank();
      sizes[slot] = group.world_size();
      sums[slot] = all_reduce_one(*group.group(), 1.0f);
    });
  }
  while (waiting.load() < 2) std::this_thread::yield();
  EXPECT_EQ(recovery_notice::publish_joined_node(*store, {1, 2}), 2);
  for (int slot : {1, 2}) {  // the joined node's new processes
    threads.emplace_back([&, slot] {
      RecoverableGroup group(options(slot));
      ranks[slot] = group.rank();
      sizes[slot] = group.world_size();
      sums[slot] = all_reduce_one(*group.group(), 1.0f);
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_TRUE(errors[0].has_value()) << "slot 0's collective in flight was not given up";
  EXPECT_NE(std::string(errors[0]->what()).find("ranks 1,2 of 4 came back with a node that joined"),
            std::string::npos)
      << errors[0]->what();
  for (int slot = 0; slot < 4; ++slot) {
    EXPECT_EQ(ranks[slot], slot);
    EXPECT_EQ(sizes[slot], 4);
    EXPECT_EQ(sums[slot], 4.0f) << "slot " << slot;
  }
}

// A process of a lost node that comes back (a network split healed) after a new node took its
// slots finds no place: the slots are members again, but of the new node's processes.
TEST(RecoverableGroup, AProcessOfALostNodeFindsNoPlaceOnceANodeTookItsSlots) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(std::chrono::minutes(5));
  std::atomic<int> formed{0};
  std::atomic<bool> published{false};
  std::array<std::string, 4> removed;
  std::vector<std::thread> threads;
  for (int slot = 0; slot < 4; ++slot) {
    threads.emplace_back([&, slot] {
      RecoverableGroup group(options_for(slot, store, 4));
      EXPECT_EQ(all_reduce_one(*group.group(), 1.0f), 4.0f);
      ++formed;
      if (slot != 1 && slot != 2) return;
      while (!published.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      try {
        group.reform();
      } catch (const RemovedFromJobError& e) {
        removed[slot] = e.what();
      }
    });
  }
  while (formed.load() < 4) std::this_thread::yield();
  EXPECT_EQ(recovery_notice::publish_lost_node(*store, {1, 2}), 1);
  EXPECT_EQ(recovery_notice::publish_joined_node(*store, {1, 2}), 2);
  EXPECT_EQ(recovery_notice::members(*store, 2, 4), (std::vector<int>{0, 1, 2, 3}));
  published = true;
  for (auto& t : threads) t.join();
  for (int slot : {1, 2}) {
    EXPECT_NE(removed[slot].find("no longer a member of the job"), std::string::npos)
        << "slot " << slot << " re-formed in a slot a new node took: '" << removed[slot] << "'";
  }
  EXPECT_TRUE(recovery_notice::removed_between(*store, 1, 0, 2));
  EXPECT_FALSE(recovery_notice::removed_between(*store, 1, 1, 2));
  EXPECT_FALSE(recovery_notice::removed_between(*store, 0, 0, 2));
}

// A finished/<r> record holds for the process that wrote it: a later record naming the slot (a
// restart in place, a lost node, a joining node) means another process has the slot now.
TEST(RecoveryNotice, AFinishedSlotStaysFinishedUntilALaterRecordNamesIt) {
  HashStore store;
  using V = std::vector<int>;
  EXPECT_EQ(recovery_notice::read_finish_count(store), 0);
  EXPECT_TRUE(recovery_notice::finished_slots(store, {0, 1, 2, 3}).empty());
  recovery_notice::publish_finished(store, 0, 0);
  recovery_notice::publish_finished(store, 2, 0);
  EXPECT_EQ(recovery_notice::read_finish_count(store), 2);
  EXPECT_EQ(recovery_notice::finished_slots(store, {0, 1, 2, 3}), (V{0, 2}));
  // Rank 1 restarted in place: its peers' records still hold.
  EXPECT_EQ(recovery_notice::publish_lost_rank(store, 1), 1);
  EXPECT_EQ(recovery_notice::finished_slots(store, {0, 1, 2, 3}), (V{0, 2}));
  // Rank 2 restarted after it finished (it exited with an error after closing its group).
  EXPECT_EQ(recovery_notice::publish_lost_rank(store, 2), 2);
  EXPECT_EQ(recovery_notice::finished_slots(store, {0, 1, 2, 3}), (V{0}));
  // A record written at the newest generation holds; a lost node's record overrides it, and a
  // joining node's new process is not the one that finished.
  recovery_notice::publish_finished(store, 3, 2);
  EXPECT_EQ(recovery_notice::finished_slots(store, {3}), (V{3}));
  EXPECT_EQ(recovery_notice::publish_lost_node(store, {3}), 3);
  EXPECT_TRUE(recovery_notice::finished_slots(store, {3}).empty());
  recovery_notice::publish_finished(store, 1, 3);
  EXPECT_EQ(recovery_notice::publish_joined_node(store, {3}), 4);
  EXPECT_EQ(recovery_notice::finished_slots(store, {0, 1, 2, 3}), (V{0, 1}));
  // The slot formed a group again in the same process.
  recovery_notice::clear_finished(store, 0);
  recovery_notice::clear_finished(store, 2);  // no record of its own: nothing to clear
  EXPECT_EQ(recovery_notice::finished_slots(store, {0, 1, 2, 3}), (V{1}));
  EXPECT_EQ(recovery_notice::read_finish_count(store), 4);
  store.set("ddp/recovery/finished/5", "soon");
  EXPECT_THROW(recovery_notice::finished_slots(store, {5}), ProtocolError);
}

// The replacement's group timeout, and a hang guard past it. The tests tell a refusal from a
// replacement that waited out its group timeout by what it throws (PeersFinishedError naming
// the finished ranks, or a TimeoutError naming the ranks that never joined), not by the clock:
// a loaded CI run (TSan) once took longer than the 5 s this test allowed for the refusal.
constexpr auto kLongGroupTimeout = std::chrono::seconds(20);
constexpr auto kAnswerGuard = kLongGroupTimeout + std::chrono::seconds(30);

// Ranks as threads, each with its own connections to a real TcpStore (as processes have).
struct TcpJob {
  TcpJob() {
    TcpStoreOptions o;
    o.port = 0;
    o.is_server = true;
    o.timeout = std::chrono::seconds(30);
    server = std::make_unique<TcpStore>(o);
  }
  RecoverableGroupOptions options(int rank, std::chrono::milliseconds timeout) const {
    RecoverableGroupOptions o = options_for(rank, client(), kWorld);
    o.watch_store = client();
    o.timeout = timeout;
    return o;
  }
  // Every rank's group of generation 0, after one collective.
  std::vector<std::unique_ptr<RecoverableGroup>> form_all() const {
    std::vector<std::unique_ptr<RecoverableGroup>> groups(kWorld);
    std::vector<std::thread> threads;
    for (int r = 0; r < kWorld; ++r) {
      threads.emplace_back([&, r] {
        groups[r] = std::make_unique<RecoverableGroup>(options(r, kLongGroupTimeout));
        EXPECT_EQ(all_reduce_one(*groups[r]->group(), 1.0f), 3.0f);
      });
    }
    for (auto& t : threads) t.join();
    return groups;
  }
  std::shared_ptr<Store> client() const {
    TcpStoreOptions o;
    o.port = server->port();
    o.timeout = std::chrono::seconds(30);
    return std::make_shared<TcpStore>(o);
  }
  std::unique_ptr<TcpStore> server;
};

// The job's last step: rank 1 dies right after it, ddprun restarts it, and ranks 0 and 2 finish
// (close their groups) before the replacement starts. The replacement refuses at once with
// PeersFinishedError naming them, instead of waiting out the group timeout for a generation
// nobody else will form.
TEST(RecoverableGroup, AReplacementWhosePeersFinishedRefusesAtOnce) {
  TcpJob job;
  std::vector<std::unique_ptr<RecoverableGroup>> peers = job.form_all();
  throw_in_scope(std::move(peers[1]));  // rank 1 is killed right after the last step
  peers[0].reset();                     // ranks 0 and 2 finish
  peers[2].reset();
  EXPECT_EQ(recovery_notice::publish_lost_rank(*job.server, 1), 1);
  try {
    RecoverableGroup replacement(job.options(1, kLongGroupTimeout));
    FAIL() << "the replacement formed a generation without its finished peers";
  } catch (const PeersFinishedError& e) {
    EXPECT_EQ(e.finished_slots(), (std::vector<int>{0, 2}));
    const std::string what = e.what();
    EXPECT_NE(what.find("rank 1 of 3 cannot rejoin the job: ranks 0 and 2 already finished"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("no live peer is left to heal it from"), std::string::npos) << what;
  }
}

// The same when the peers finish while the replacement already waits for them.
TEST(RecoverableGroup, AWaitingReplacementRefusesOnceItsPeersFinish) {
  TcpJob job;
  std::vector<std::unique_ptr<RecoverableGroup>> peers = job.form_all();
  throw_in_scope(std::move(peers[1]));  // rank 1 dies
  EXPECT_EQ(recovery_notice::publish_lost_rank(*job.server, 1), 1);
  struct Outcome {
    bool refused = false;
    std::vector<int> finished;  // PeersFinishedError::finished_slots()
    std::string what;
  };
  auto replacement = std::async(std::launch::async, [&] {
    Outcome o;
    try {
      RecoverableGroup group(job.options(1, kLongGroupTimeout));
      o.what = "formed generation " + std::to_string(group.generation());
    } catch (const PeersFinishedError& e) {
      o.refused = true;
      o.finished = e.finished_slots();
      o.what = e.what();
    } catch (const std::exception& e) {
      o.what = std::string("other error: ") + e.what();
    }
    return o;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(replacement.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
      << "the replacement did not wait for its peers: " << replacement.get().what;
  peers[0].reset();  // they finish: their last step is done
  peers[2].reset();
  ASSERT_EQ(replacement.wait_for(kAnswerGuard), std::future_status::ready)
      << "the replacement still waits for its finished peers";
  // The first finished peer is enough to refuse (the generation can never form without it):
  // the replacement may see rank 0's record before rank 2's is written (a TSan run did).
  const Outcome got = replacement.get();
  ASSERT_TRUE(got.refused) << got.what;
  ASSERT_FALSE(got.finished.empty()) << got.what;
  for (int slot : got.finished) EXPECT_TRUE(slot == 0 || slot == 2) << got.what;
  EXPECT_NE(got.what.find("already finished"), std::string::npos) << got.what;
}

// The watcher waits in the store for the next generation's record, on a connection of its own:
// the notice reaches every rank at once, not at the watcher's next look. With an interval of a
// minute, a watcher that read the counter once per interval would still see nothing after the
// 20 s this test waits; the destructors end the watchers' waits at once (a TcpStore's).
TEST(RecoverableGroup, TheWatcherLearnsOfANewGenerationAtOnceNotAtItsInterval) {
  TcpJob job;
  std::vector<std::unique_ptr<RecoverableGroup>> groups(kWorld);
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      RecoverableGroupOptions o = job.options(r, kLongGroupTimeout);
      o.watch_interval = std::chrono::minutes(1);
      groups[r] = std::make_unique<RecoverableGroup>(o);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(recovery_notice::publish_lost_rank(*job.server, 1), 1);
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_TRUE(groups[r]->wait_announced_after(0, std::chrono::seconds(20))) << "rank " << r;
    EXPECT_EQ(groups[r]->lost_rank(), 1) << "rank " << r;
  }
  for (auto& g : groups) throw_in_scope(std::move(g));
}

// --recovery shrink with defer_return (ddp::StepManager's): rank 1's replacement starts with a
// group of its own and claims its slot only at claim_return(), so until then the survivors'
// group of two stays current (no record is added) and they keep running collectives in it.
// After the claim all three form the next generation with their launch ranks.
TEST(RecoverableGroup, AReplacementDeferringItsReturnClaimsTheSlotOnlyWhenAsked) {
  TcpJob job;
  std::vector<std::unique_ptr<RecoverableGroup>> peers = job.form_all();
  throw_in_scope(std::move(peers[1]));  // rank 1 is killed
  EXPECT_EQ(recovery_notice::publish_rank_left(*job.server, 1), 1);
  std::array<float, kWorld> shrunk_sums{}, sums{};
  std::array<int, kWorld> ranks{-1, -1, -1};
  std::atomic<int> shrunk{0}, while_returning{0};
  std::atomic<bool> claimed{false};
  std::vector<std::thread> survivors;
  for (int slot : {0, 2}) {
    survivors.emplace_back([&, slot] {
      RecoverableGroup& group = *peers[slot];
      while (!group.stale()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      group.reform();  // without slot 1
      shrunk_sums[slot] = all_reduce_one(*group.group(), 1.0f);
      ++shrunk;
      // Collectives of the two go on while the replacement has not claimed its slot.
      for (;;) {
        const bool was_stale = group.stale();
        if (claimed.load()) break;
        EXPECT_FALSE(was_stale) << "slot " << slot;
        try {
          all_reduce_one(*group.group(), 1.0f);
          ++while_returning;
        } catch (const PeerLostError&) {  // the other one saw the claim first
          EXPECT_TRUE(claimed.load()) << "slot " << slot;
          break;
        }
      }
      while (!group.stale()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      group.reform();  // slot 1 is back
      ranks[slot] = group.rank();
      sums[slot] = all_reduce_one(*group.group(), 1.0f);
    });
  }
  while (shrunk.load() < 2) std::this_thread::yield();
  RecoverableGroupOptions o = job.options(1, kLongGroupTimeout);
  o.defer_return = true;
  RecoverableGroup replacement(o);
  EXPECT_TRUE(replacement.returning());
  EXPECT_EQ(replacement.rank(), 0);
  EXPECT_EQ(replacement.world_size(), 1);
  ASSERT_NE(replacement.group(), nullptr);
  EXPECT_EQ(all_reduce_one(*replacement.group(), 5.0f), 5.0f);  // its own group: no one else
  EXPECT_EQ(recovery_notice::read_generation(*job.server), 1);  // nothing claimed yet
  // The survivors run collectives meanwhile (a few each).
  while (while_returning.load() < 6) std::this_thread::yield();
  claimed = true;
  replacement.claim_return();
  EXPECT_FALSE(replacement.returning());
  EXPECT_EQ(replacement.generation(), 2);
  EXPECT_EQ(replacement.rank(), 1);
  EXPECT_EQ(replacement.world_size(), 3);
  EXPECT_EQ(all_reduce_one(*replacement.group(), 1.0f), 3.0f);
  for (auto& t : survivors) t.join();
  for (int slot : {0, 2}) {
    EXPECT_EQ(shrunk_sums[slot], 2.0f) << "slot " << slot;
    EXPECT_EQ(ranks[slot], slot) << "slot " << slot;
    EXPECT_EQ(sums[slot], 3.0f) << "slot " << slot;
  }
}

// A normal in-place recovery is not taken for finished peers: each rank formed its group a
// second time in the same process (the first one's finish no longer holds), rank 2 is
// restarted after it closed its group cleanly (a later record names it), and the survivors wait
// for the late rank 1 and for the replacement as before.
TEST(RecoverableGroup, GroupsFormedAgainAndReplacementsAreNotTakenForFinished) {
  TcpJob job;
  std::array<float, kWorld> sums{};
  std::array<std::string, kWorld> errors;
  std::vector<std::thread> threads;
  for (int r = 0; r < kWorld; ++r) {
    threads.emplace_back([&, r] {
      try {
        {
          RecoverableGroup first(job.options(r, kLongGroupTimeout));
          EXPECT_EQ(all_reduce_one(*first.group(), 1.0f), 3.0f);
        }
        RecoverableGroup again(job.options(r, kLongGroupTimeout));
        EXPECT_EQ(all_reduce_one(*again.group(), 1.0f), 3.0f);
        if (r == 2) return;  // closes its group cleanly, then "dies": restarted below
        while (!again.stale()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
        // Rank 0 waits for rank 1 with rank 1's first group's finish in the store.
        if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(500));
        again.reform();
        sums[r] = all_reduce_one(*again.group(), 1.0f);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  threads[2].join();
  EXPECT_EQ(recovery_notice::publish_lost_rank(*job.server, 2), 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  try {
    RecoverableGroup replacement(job.options(2, kLongGroupTimeout));
    sums[2] = all_reduce_one(*replacement.group(), 1.0f);
  } catch (const std::exception& e) {
    errors[2] = e.what();
  }
  threads[0].join();
  threads[1].join();
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(sums[r], 3.0f) << "rank " << r;
  }
}

TEST(RecoverableGroup, BadOptionsAreUsageErrors) {
  RecoverableGroupOptions o = options_for(0, std::make_shared<HashStore>());
  o.watch_interval = std::chrono::milliseconds(0);
  EXPECT_THROW(RecoverableGroup{o}, UsageError);
  o = options_for(3, std::make_shared<HashStore>());
  EXPECT_THROW(RecoverableGroup{o}, UsageError);
  o = options_for(0, std::make_shared<HashStore>());
  o.launch_world_size = kWorld + 1;  // above the process's world size
  EXPECT_THROW(RecoverableGroup{o}, UsageError);
  // A slot past the launch's that no node added never forms generation 0.
  o = options_for(kWorld, std::make_shared<HashStore>(), kWorld + 1);
  o.launch_world_size = kWorld;
  EXPECT_THROW(RecoverableGroup{o}, UsageError);
}

}  // namespace
}  // namespace ddp
