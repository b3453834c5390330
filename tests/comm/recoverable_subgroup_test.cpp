// RecoverableSubgroup (new_group under in-place recovery) with ranks as threads on one
// HashStore, as recoverable_group_test.cpp does for the default group: a subgroup's collective
// in flight ends with PeerLostError at the launcher's notice, the subgroup refuses while the
// job's group is stale, and after the re-form it meets the replacement's subgroup in the next
// generation (also when a member died before the group's first operation); after a lost node it
// refuses with a UsageError instead of waiting for a member, unless it is the whole job's
// (options.whole_job): then it follows the survivors.
#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/recoverable_group.hpp"
#include "ddp/comm/recoverable_subgroup.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/store/recovery_notice.hpp"
#include "ddp/util/error.hpp"

namespace ddp {
namespace {
// Its own namespace: the test executable compiles it in one unity batch with
// recoverable_group_test.cpp, whose helpers have the same names.
namespace subgroup {

constexpr int kWorld = 3;

std::shared_ptr<RecoverableGroup> job_group(int rank, const std::shared_ptr<Store>& store) {
  RecoverableGroupOptions o;
  o.rank = rank;
  o.world_size = kWorld;
  o.store = store;
  o.timeout = std::chrono::minutes(5);
  o.watch_interval = std::chrono::milliseconds(20);
  return std::make_shared<RecoverableGroup>(o);
}

// The subgroup of job ranks 0 and 2 (its ranks 0 and 1).
std::unique_ptr<RecoverableSubgroup> pair_of_0_and_2(std::shared_ptr<RecoverableGroup> parent,
                                                     int subgroup_rank) {
  RecoverableSubgroupOptions o;
  o.name = "group_1";
  o.rank = subgroup_rank;
  o.size = 2;
  // Shorter than the test's limit: a collective the notice failed to end would fail the test
  // with a TimeoutError instead of a PeerLostError.
  o.timeout = std::chrono::seconds(60);
  return std::make_unique<RecoverableSubgroup>(std::move(parent), o);
}

float all_reduce_one(const ProcessGroupPtr& pg, float value) {
  pg->all_reduce(&value, 1, DataType::kFloat32, ReduceOp::kSum)->wait(pg->timeout());
  return value;
}

TEST(RecoverableSubgroup, LostMemberAbortsItsCollectiveAndItFollowsTheReformedJob) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(std::chrono::minutes(5));
  std::optional<PeerLostError> in_flight_error;
  std::optional<std::string> stale_refusal;
  std::array<float, kWorld> sums{};
  std::array<int64_t, kWorld> generations{};
  float subgroup_sum_after = 0, replacement_subgroup_sum = 0;
  std::atomic<int> waiting{0};

  std::vector<std::thread> threads;
  threads.emplace_back([&] {  // job rank 0, a member of the subgroup
    auto job = job_group(0, store);
    auto pair = pair_of_0_and_2(job, 0);
    EXPECT_EQ(all_reduce_one(pair->group(), 1.0f), 2.0f);
    ++waiting;
    try {
      all_reduce_one(pair->group(), 1.0f);  // job rank 2 never joins this one
    } catch (const PeerLostError& e) {
      in_flight_error = e;
    }
    try {
      pair->group();
    } catch (const PeerLostError& e) {
      stale_refusal = e.what();
    }
    job->reform();
    generations[0] = job->generation();
    sums[0] = all_reduce_one(job->group(), 1.0f);
    subgroup_sum_after = all_reduce_one(pair->group(), 10.0f);
    EXPECT_EQ(pair->generation(), 1);
  });
  threads.emplace_back([&] {  // job rank 1, not a member
    auto job = job_group(1, store);
    ++waiting;
    while (!job->stale()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    job->reform();
    generations[1] = job->generation();
    sums[1] = all_reduce_one(job->group(), 2.0f);
  });
  {  // job rank 2's first incarnation: one subgroup collective, then it "dies"
    auto job = job_group(2, store);
    auto pair = pair_of_0_and_2(job, 1);
    EXPECT_EQ(all_reduce_one(pair->group(), 1.0f), 2.0f);
    while (waiting.load() < 2) std::this_thread::yield();
  }
  EXPECT_EQ(recovery_notice::publish_lost_rank(*store, 2), 1);
  threads.emplace_back([&] {  // its replacement makes the subgroup again, in generation 1
    auto job = job_group(2, store);
    generations[2] = job->generation();
    auto pair = pair_of_0_and_2(job, 1);
    sums[2] = all_reduce_one(job->group(), 3.0f);
    replacement_subgroup_sum = all_reduce_one(pair->group(), 20.0f);
  });
  for (auto& t : threads) t.join();

  ASSERT_TRUE(in_flight_error.has_value()) << "the subgroup's collective got no PeerLostError";
  EXPECT_EQ(in_flight_error->lost_rank(), 2);
  EXPECT_EQ(in_flight_error->generation(), 1);
  EXPECT_NE(std::string(in_flight_error->what()).find("collectives of group 'group_1'"),
            std::string::npos)
      << in_flight_error->what();
  ASSERT_TRUE(stale_refusal.has_value()) << "the stale subgroup handed out its aborted group";
  EXPECT_NE(stale_refusal->find("rank 2 of 3 was lost"), std::string::npos) << *stale_refusal;
  for (int r = 0; r < kWorld; ++r) {
    EXPECT_EQ(generations[r], 1) << "rank " << r;
    EXPECT_EQ(sums[r], 6.0f) << "rank " << r;
  }
  EXPECT_EQ(subgroup_sum_after, 30.0f);
  EXPECT_EQ(replacement_subgroup_sum, 30.0f);
}

// A member lost before the group's first operation never arrives: the others' first operation
// (which forms the group) ends at the notice too, instead of waiting out the group timeout.
TEST(RecoverableSubgroup, AMemberLostBeforeTheFirstOperationEndsTheFormingAtTheNotice) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(std::chrono::minutes(5));
  std::optional<PeerLostError> forming_error;
  float after = 0, replacement_after = 0;
  std::atomic<int> made{0};
  std::vector<std::thread> threads;
  threads.emplace_back([&] {
    auto job = job_group(0, store);
    auto pair = pair_of_0_and_2(job, 0);
    ++made;
    try {
      pair->group();  // job rank 2 died before its first operation
    } catch (const PeerLostError& e) {
      forming_error = e;
    }
    job->reform();
    after = all_reduce_one(pair->group(), 1.0f);
  });
  threads.emplace_back([&] {
    auto job = job_group(1, store);
    ++made;
    while (!job->stale()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    job->reform();
  });
  {
    auto job = job_group(2, store);
    auto pair = pair_of_0_and_2(job, 1);
    while (made.load() < 2) std::this_thread::yield();
  }
  EXPECT_EQ(recovery_notice::publish_lost_rank(*store, 2), 1);
  threads.emplace_back([&] {
    auto job = job_group(2, store);
    auto pair = pair_of_0_and_2(job, 1);
    replacement_after = all_reduce_one(pair->group(), 2.0f);
  });
  for (auto& t : threads) t.join();
  ASSERT_TRUE(forming_error.has_value()) << "forming the group did not end at the notice";
  EXPECT_EQ(forming_error->lost_rank(), 2);
  EXPECT_EQ(after, 3.0f);
  EXPECT_EQ(replacement_after, 3.0f);
}

TEST(RecoverableSubgroup, RefusesToFollowAJobThatLostANode) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(std::chrono::minutes(5));
  std::optional<std::string> refusal;
  std::atomic<int> made{0};
  std::vector<std::thread> threads;
  for (int r : {0, 1}) {  // the survivors: job ranks 0 and 1; the subgroup pairs 0 and 2
    threads.emplace_back([&, r] {
      auto job = job_group(r, store);
      std::unique_ptr<RecoverableSubgroup> pair;
      if (r == 0) pair = pair_of_0_and_2(job, 0);
      ++made;
      while (!job->stale()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      job->reform();
      EXPECT_EQ(job->world_size(), 2);
      if (pair) {
        try {
          pair->group();
        } catch (const UsageError& e) {
          refusal = e.what();
        }
      }
    });
  }
  {
    auto job = job_group(2, store);
    auto pair = pair_of_0_and_2(job, 1);
    while (made.load() < 2) std::this_thread::yield();
  }
  EXPECT_EQ(recovery_notice::publish_lost_node(*store, {2}), 1);
  for (auto& t : threads) t.join();
  ASSERT_TRUE(refusal.has_value()) << "the subgroup did not refuse after the lost node";
  EXPECT_NE(refusal->find("the job's ranks changed (3 -> 2 ranks"), std::string::npos) << *refusal;
}

TEST(RecoverableSubgroup, AWholeJobSubgroupFollowsAJobThatLostANode) {
  auto store = std::make_shared<HashStore>();
  store->set_timeout(std::chrono::minutes(5));
  std::atomic<int> made{0};
  std::array<float, 2> sums{};
  std::array<int, 2> sizes{};
  std::vector<std::thread> threads;
  for (int r : {0, 1}) {  // the survivors; job rank 2 is lost with its node
    threads.emplace_back([&, r] {
      auto job = job_group(r, store);
      RecoverableSubgroupOptions o;
      o.name = "default_pg/cuda";
      o.whole_job = true;
      o.timeout = std::chrono::seconds(60);
      RecoverableSubgroup all(job, o);
      EXPECT_EQ(all_reduce_one(all.group(), 1.0F), 3.0F);  // generation 0: the three ranks
      ++made;
      while (!job->stale()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      job->reform();
      ProcessGroupPtr pg = all.group();
      sizes[r] = pg->size();
      EXPECT_EQ(pg->rank(), job->rank());
      sums[r] = all_reduce_one(pg, static_cast<float>(r + 1));
    });
  }
  {
    auto job = job_group(2, store);
    RecoverableSubgroupOptions o;
    o.name = "default_pg/cuda";
    o.whole_job = true;
    o.timeout = std::chrono::seconds(60);
    RecoverableSubgroup all(job, o);
    EXPECT_EQ(all_reduce_one(all.group(), 1.0F), 3.0F);
    while (made.load() < 2) std::this_thread::yield();
  }
  EXPECT_EQ(recovery_notice::publish_lost_node(*store, {2}), 1);
  for (auto& t : threads) t.join();
  EXPECT_EQ(sizes, (std::array<int, 2>{2, 2}));
  EXPECT_EQ(sums, (std::array<float, 2>{3.0F, 3.0F}));  // 1 + 2: the two survivors only
}

}  // namespace subgroup
}  // namespace
}  // namespace ddp
