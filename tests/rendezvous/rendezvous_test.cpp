// The rendezvous protocol with agents as threads on a loopback store: joining, MIN:MAX with
// last call, generations, static node ranks, shutdown.
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "ddp/util/error.hpp"
#include "rdzv_test_util.hpp"

namespace ddp::rdzv::test {
namespace {

std::vector<std::unique_ptr<Rendezvous>> make_agents(const LoopbackStore& store,
                                                     const std::string& run_id, NodeRange nodes,
                                                     int count, bool heterogeneous = false) {
  std::vector<std::unique_ptr<Rendezvous>> agents;
  for (int i = 0; i < count; ++i) {
    agents.push_back(std::make_unique<Rendezvous>(
        agent_options(store, run_id, nodes, i, heterogeneous ? i + 1 : 2), store.connect()));
  }
  return agents;
}

// Ranks must tile [0, world_size) in node-rank order, with one master for all.
void expect_consistent(const std::vector<RoundInfo>& rounds, int nodes, int world) {
  std::vector<const RoundInfo*> by_rank(nodes, nullptr);
  for (const auto& r : rounds) {
    ASSERT_GE(r.node_rank, 0);
    ASSERT_LT(r.node_rank, nodes);
    EXPECT_EQ(by_rank[r.node_rank], nullptr) << "node rank " << r.node_rank << " given twice";
    by_rank[r.node_rank] = &r;
    EXPECT_EQ(r.num_nodes, nodes);
    EXPECT_EQ(r.world_size, world);
    EXPECT_EQ(r.master_port, 40000);
    EXPECT_EQ(r.master_addr, rounds[0].master_addr);
    EXPECT_EQ(r.generation, rounds[0].generation);
  }
  int offset = 0;
  for (const auto* r : by_rank) {
    ASSERT_NE(r, nullptr);
    EXPECT_EQ(r->rank_offset, offset);
    offset += r->local_world_size;
  }
  EXPECT_EQ(offset, world);
}

TEST(Rendezvous, FixedCountJoinsWithHeterogeneousWorkers) {
  LoopbackStore store;
  auto agents = make_agents(store, "job", {4, 4}, 4, /*heterogeneous=*/true);
  auto rounds = rounds_in_parallel(agents);
  expect_consistent(rounds, 4, 1 + 2 + 3 + 4);
  // Node rank 0 publishes MASTER_ADDR = its own address and knows every member.
  for (const auto& r : rounds) {
    if (r.node_rank != 0) continue;
    ASSERT_EQ(r.nodes.size(), 4u);
    EXPECT_EQ(r.master_addr, r.nodes[0].addr);
  }
  EXPECT_EQ(rounds[0].generation, 0);
}

TEST(Rendezvous, RangeClosesAfterLastCallWithEveryoneWhoCame) {
  LoopbackStore store;
  auto agents = make_agents(store, "job", {2, 5}, 3);
  auto rounds = rounds_in_parallel(agents);
  expect_consistent(rounds, 3, 6);
}

TEST(Rendezvous, MaxCapsTheRoundAndTheExtraNodeWaitsForAdmission) {
  LoopbackStore store;
  auto agents = make_agents(store, "job", {1, 2}, 2);
  auto rounds = rounds_in_parallel(agents);
  expect_consistent(rounds, 2, 4);
  // A third node finds the round full; with nobody leaving it is never admitted.
  auto o = agent_options(store, "job", {1, 2}, 7);
  o.conf.join_timeout = 500ms;
  Rendezvous late(o, store.connect());
  try {
    late.next_round();
    FAIL() << "expected a timeout";
  } catch (const RendezvousTimeoutError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("waiting for admission (round 0 runs with 2 of at most 2 nodes)"),
              std::string::npos)
        << m;
    EXPECT_EQ(e.diagnosis().joined_count, 3);
  }
}

TEST(Rendezvous, NewRoundHasNextGenerationAndFreshKeys) {
  LoopbackStore store;
  auto agents = make_agents(store, "job", {3, 3}, 3);
  auto first = rounds_in_parallel(agents);
  expect_consistent(first, 3, 6);
  agents[1]->request_new_round("test asked for it");
  auto second = rounds_in_parallel(agents);
  expect_consistent(second, 3, 6);
  EXPECT_EQ(second[0].generation, first[0].generation + 1);
  // Keys of round 1 live under rdzv/job/1/.
  auto client = store.connect();
  EXPECT_TRUE(client->check({"rdzv/job/1/closed", "rdzv/job/1/world", "rdzv/job/0/changed"}));
  EXPECT_EQ(client->get("rdzv/job/0/changed"), "test asked for it");
  EXPECT_EQ(client->get("rdzv/job/gen"), "1");
}

// Node 0 names the round's standby stores: the first standby_stores members that offered one,
// in node-rank order, and every member learns the same list.
TEST(Rendezvous, RoundNamesTheFirstStandbyStoresInNodeRankOrder) {
  LoopbackStore store;
  std::vector<std::unique_ptr<Rendezvous>> agents;
  for (int i = 0; i < 4; ++i) {
    auto o = agent_options(store, "job", {4, 4}, i);
    o.conf.standby_stores = 2;
    // Agent 1 offers none (as the agent serving the store does).
    if (i != 1) o.standby = "10.0.0." + std::to_string(i) + ":" + std::to_string(5000 + i);
    agents.push_back(std::make_unique<Rendezvous>(o, store.connect()));
  }
  auto rounds = rounds_in_parallel(agents);
  expect_consistent(rounds, 4, 4);
  std::vector<std::string> offered;
  const RoundInfo* node0 = nullptr;
  for (const auto& r : rounds) node0 = r.node_rank == 0 ? &r : node0;
  ASSERT_NE(node0, nullptr);
  for (const JoinedNode& n : node0->nodes) {
    if (!n.standby.empty()) offered.push_back(n.standby);
  }
  ASSERT_EQ(offered.size(), 3u);
  const std::vector<std::string> expected(offered.begin(), offered.begin() + 2);
  for (const auto& r : rounds) EXPECT_EQ(r.standbys, expected) << "node " << r.node_rank;
}

// The store's host died: the members move to an empty standby store and form the next round
// there, with the generation after the lost one; a later loss moves on the same way.
TEST(Rendezvous, MembersMovedToAStandbyStoreFormTheNextGeneration) {
  auto first_store = std::make_unique<LoopbackStore>();
  auto agents = make_agents(*first_store, "job", {2, 3}, 3);
  rounds_in_parallel(agents);
  auto before = rounds_in_parallel(agents);
  ASSERT_EQ(before[0].generation, 1);
  first_store.reset();  // the host agent is gone, and one of the nodes with it
  agents.pop_back();

  LoopbackStore standby;
  for (auto& a : agents) a->move_to_store(standby.connect());
  auto after = rounds_in_parallel(agents);
  expect_consistent(after, 2, 4);
  EXPECT_EQ(after[0].generation, 2);
  EXPECT_EQ(standby.connect()->get("rdzv/job/gen"), "2");

  LoopbackStore another;
  for (auto& a : agents) a->move_to_store(another.connect());
  EXPECT_EQ(rounds_in_parallel(agents)[0].generation, 3);
}

TEST(Rendezvous, LateNodeIsAdmittedAtTheNextRound) {
  LoopbackStore store;
  auto agents = make_agents(store, "job", {2, 3}, 2);
  auto first = rounds_in_parallel(agents);
  expect_consistent(first, 2, 4);

  // Members watch their round; a third node arrives and counts itself as pending.
  std::vector<std::promise<std::string>> changed(2);
  std::vector<std::unique_ptr<MembershipWatcher>> watchers;
  for (int i = 0; i < 2; ++i) {
    watchers.push_back(std::make_unique<MembershipWatcher>(
        agents[i]->options(), first[i], store.connect(),
        [&changed, i](const std::string& reason) { changed[i].set_value(reason); }));
  }
  agents.push_back(
      std::make_unique<Rendezvous>(agent_options(store, "job", {2, 3}, 2, 2), store.connect()));
  auto late = std::async(std::launch::async, [&] { return agents[2]->next_round(); });
  for (auto& p : changed) {
    std::string reason = p.get_future().get();
    EXPECT_NE(reason.find("1 node is waiting to join (round 0 has 2 of at most 3 nodes)"),
              std::string::npos)
        << reason;
  }
  watchers.clear();
  auto f0 = std::async(std::launch::async, [&] { return agents[0]->next_round(); });
  auto f1 = std::async(std::launch::async, [&] { return agents[1]->next_round(); });
  std::vector<RoundInfo> second = {f0.get(), f1.get(), late.get()};
  expect_consistent(second, 3, 6);
  EXPECT_EQ(second[0].generation, 1);
}

// A round whose members all finished never ends by itself (an earlier job with the same run
// id, whose keys etcd still keeps): a node arriving late ends it instead of waiting for
// join_timeout, and the nodes of the new job meet in the next round.
TEST(Rendezvous, LateNodeEndsARoundWhoseMembersAllFinished) {
  LoopbackStore store;
  auto old_job = make_agents(store, "job", {2, 3}, 2);
  auto first = rounds_in_parallel(old_job);
  for (auto& a : old_job) a->mark_finished();
  auto new_job = make_agents(store, "job", {2, 3}, 2);
  for (auto& a : new_job) {
    RendezvousOptions o = a->options();
    o.conf.join_timeout = std::chrono::seconds(60);
    a = std::make_unique<Rendezvous>(o, store.connect());
  }
  auto second = rounds_in_parallel(new_job);
  expect_consistent(second, 2, 4);
  EXPECT_EQ(second[0].generation, first[0].generation + 1);
}

TEST(Rendezvous, StaticUsesGivenNodeRanks) {
  LoopbackStore store;
  std::vector<std::unique_ptr<Rendezvous>> agents;
  for (int rank : {2, 0, 1}) {
    auto o = agent_options(store, "job", {3, 3}, rank, rank + 1);
    o.backend = Backend::kStatic;
    o.node_rank = rank;
    agents.push_back(std::make_unique<Rendezvous>(o, store.connect()));
  }
  auto rounds = rounds_in_parallel(agents);
  expect_consistent(rounds, 3, 6);
  EXPECT_EQ(rounds[0].node_rank, 2);
  EXPECT_EQ(rounds[0].rank_offset, 3);
  EXPECT_EQ(rounds[1].master_addr, "10.0.0.0");
}

TEST(Rendezvous, StaticRejectsTwoNodesWithOneRank) {
  LoopbackStore store;
  auto o = agent_options(store, "job", {2, 2}, 1);
  o.backend = Backend::kStatic;
  o.node_rank = 1;
  o.conf.join_timeout = 2s;
  Rendezvous a(o, store.connect());
  auto first = std::async(std::launch::async, [&] {
    try {
      a.next_round();
    } catch (const Error&) {
    }
  });
  // Wait until the first claim is visible, then claim the same rank from another host.
  store.connect()->wait({"rdzv/job/0/node/1"}, 10s);
  o.hostname = "intruder";
  Rendezvous b(o, store.connect());
  try {
    b.next_round();
    FAIL() << "expected a UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--node-rank 1 is claimed by two nodes: host1"),
              std::string::npos)
        << e.what();
  }
  first.get();
}

TEST(Rendezvous, ShutdownEndsTheRunForEveryone) {
  LoopbackStore store;
  auto agents = make_agents(store, "job", {2, 2}, 2);
  rounds_in_parallel(agents);
  agents[0]->shutdown("node host0 gave up after 3 restarts");
  try {
    agents[1]->next_round();
    FAIL() << "expected RendezvousClosedError";
  } catch (const RendezvousClosedError& e) {
    EXPECT_NE(std::string(e.what()).find("shut down by one of its agents: node host0 gave up"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddp::rdzv::test
