// How the members of an NCCL group find its unique id in the store (no GPU needed): the
// store key comes from what the members agree on, so concurrent groups never cross. And the
// check that no two members use one GPU, which every member answers alike.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ddp/comm/nccl_process_group.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/util/error.hpp"
#include "nccl_bootstrap.hpp"

namespace ddp::test {
namespace {

using namespace std::chrono_literals;
using nccl_detail::exchange_group_secret;
using nccl_detail::GroupIdentity;

// What member `rank` of `group` gets; rank 0 publishes `secret`.
std::string join(HashStore& store, const GroupIdentity& group, int rank,
                 const std::string& secret) {
  return exchange_group_secret(store, group, rank, 1s, [&] { return secret; });
}

// Global ranks {0,1} and {2,3} of one job each create a 2-rank group on the shared store at
// the same time. Rank 0 of both groups publishes before rank 1 of either reads, and the
// second group's rank 1 reads first: with per-rank counters it read the first group's id.
TEST(NcclBootstrap, DisjointGroupsCreatedConcurrentlyGetTheirOwnIds) {
  HashStore store;
  GroupIdentity a{"default_pg", 2, {0, 1}};
  GroupIdentity b{"default_pg", 2, {2, 3}};
  EXPECT_EQ(join(store, a, 0, "id-A"), "id-A");
  EXPECT_EQ(join(store, b, 0, "id-B"), "id-B");
  EXPECT_EQ(join(store, b, 1, "unused"), "id-B");
  EXPECT_EQ(join(store, a, 1, "unused"), "id-A");
}

TEST(NcclBootstrap, GroupsWithDifferentNamesDoNotCross) {
  HashStore store;
  GroupIdentity a{"tp", 2, {}};
  GroupIdentity b{"dp", 2, {}};
  EXPECT_EQ(join(store, a, 0, "id-tp"), "id-tp");
  EXPECT_EQ(join(store, b, 0, "id-dp"), "id-dp");
  EXPECT_EQ(join(store, b, 1, "unused"), "id-dp");
  EXPECT_EQ(join(store, a, 1, "unused"), "id-tp");
}

// Successive groups of one identity pair up in creation order, also with ranks as threads.
TEST(NcclBootstrap, SuccessiveGroupsOfOneIdentityPairInOrder) {
  HashStore store;
  GroupIdentity world{"default_pg", 2, {}};
  std::vector<std::string> seen;
  std::thread rank1([&] {
    for (int i = 0; i < 3; ++i) seen.push_back(join(store, world, 1, "unused"));
  });
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(join(store, world, 0, "id-" + std::to_string(i)), "id-" + std::to_string(i));
  rank1.join();
  EXPECT_EQ(seen, (std::vector<std::string>{"id-0", "id-1", "id-2"}));
}

TEST(NcclBootstrap, MissingRankZeroIsATimeoutNamingTheGroup) {
  HashStore store;
  GroupIdentity group{"tp", 2, {4, 5}};
  try {
    exchange_group_secret(store, group, 1, 50ms, [] { return std::string("unused"); });
    FAIL() << "rank 1 got an id nobody published";
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("rank 1 of 2"), std::string::npos) << what;
    EXPECT_NE(what.find("'tp'"), std::string::npos) << what;
  }
}

// Each member's outcome of check_one_rank_per_gpu when member r uses GPU gpus[r] (ranks as
// threads on one store): "" when it passed, else its SharedGpuError's message.
std::vector<std::string> check_gpus(HashStore& store, const GroupIdentity& group,
                                    const std::vector<std::string>& gpus) {
  std::vector<std::string> outcome(gpus.size());
  std::vector<std::thread> members;
  for (int r = 0; r < static_cast<int>(gpus.size()); ++r) {
    members.emplace_back([&, r] {
      try {
        nccl_detail::check_one_rank_per_gpu(store, group, r, 10s, gpus[r]);
      } catch (const SharedGpuError& e) {
        outcome[r] = e.what();
      }
    });
  }
  for (auto& m : members) m.join();
  return outcome;
}

TEST(NcclBootstrap, MembersOnDistinctGpusPassTheCheck) {
  HashStore store;
  GroupIdentity group{"default_pg", 4, {}};
  // The same bus id on two hosts is two GPUs.
  auto outcome = check_gpus(
      store, group, {"a/0000:3B:00.0", "a/0000:5E:00.0", "b/0000:3B:00.0", "b/0000:5E:00.0"});
  EXPECT_EQ(outcome, std::vector<std::string>(4, ""));
}

TEST(NcclBootstrap, TwoMembersOnOneGpuFailEveryMemberAlike) {
  HashStore store;
  GroupIdentity group{"default_pg", 3, {}};
  auto outcome = check_gpus(store, group, {"a/0000:3B:00.0", "a/0000:5E:00.0", "a/0000:3B:00.0"});
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(outcome[r].find("use a GPU that another member"), std::string::npos)
        << "rank " << r << ": '" << outcome[r] << "'";
  }
  EXPECT_NE(outcome[1].find("not this rank's GPU: a/0000:5E:00.0"), std::string::npos)
      << outcome[1];
  EXPECT_NE(outcome[2].find("among them this rank's GPU: a/0000:3B:00.0"), std::string::npos)
      << outcome[2];
  // The next group of the same identity checks afresh: its members moved to their own GPUs.
  outcome = check_gpus(store, group, {"a/0000:3B:00.0", "a/0000:5E:00.0", "a/0000:86:00.0"});
  EXPECT_EQ(outcome, std::vector<std::string>(3, ""));
}

TEST(NcclBootstrap, GpuCheckWithAMissingMemberIsATimeoutSayingHowManyArrived) {
  HashStore store;
  GroupIdentity group{"tp", 2, {}};
  try {
    nccl_detail::check_one_rank_per_gpu(store, group, 0, 50ms, "a/0000:3B:00.0");
    FAIL() << "the check passed without the other member";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("1 of the 2 members arrived"), std::string::npos)
        << e.what();
  }
}

// In-place recovery passes an interrupt (NcclOptions::interrupt) that throws once a newer
// membership generation is announced: a member lost while a generation's communicator forms
// must end the others' waits for it at the notice, not after the timeout (a minute here, so a
// wait that ignored the interrupt would end in TimeoutError instead of the interrupt's error).
TEST(NcclBootstrap, AnInterruptEndsTheWaitsForAMissingMember) {
  HashStore store;
  GroupIdentity group{"recovery/g1", 2, {}};
  const auto fire_at = std::chrono::steady_clock::now() + 200ms;
  int calls = 0;
  auto interrupt = [&] {
    ++calls;
    if (std::chrono::steady_clock::now() >= fire_at) {
      throw PeerLostError("generation 2 was announced", 0, 2);
    }
  };
  // Rank 1 waits for the unique id rank 0 never publishes...
  EXPECT_THROW(exchange_group_secret(
                   store, group, 1, 60s, [] { return std::string("unused"); }, interrupt),
               PeerLostError);
  EXPECT_GE(calls, 2) << "the interrupt is polled during the wait, not only before it";
  // ... and for the GPU check's verdict, which needs the missing member.
  calls = 0;
  const auto again = std::chrono::steady_clock::now() + 200ms;
  auto interrupt_again = [&] {
    ++calls;
    if (std::chrono::steady_clock::now() >= again) {
      throw PeerLostError("generation 3 was announced", 0, 3);
    }
  };
  EXPECT_THROW(
      nccl_detail::check_one_rank_per_gpu(store, group, 0, 60s, "a/0000:3B:00.0", interrupt_again),
      PeerLostError);
  EXPECT_GE(calls, 2);
}

}  // namespace
}  // namespace ddp::test
