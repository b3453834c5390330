// Membership during a round: missed heartbeats, a node leaving, a worker failure elsewhere;
// survivors re-form a smaller round when at least MIN remain.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "rdzv_test_util.hpp"

namespace ddp::rdzv::test {
namespace {

struct Node {
  std::unique_ptr<Rendezvous> rdzv;
  RoundInfo round;
  std::promise<std::string> changed;
  std::unique_ptr<MembershipWatcher> watcher;
};

std::vector<std::unique_ptr<Node>> form_round(
    const LoopbackStore& store, NodeRange range, int count,
    MembershipWatcher::OnPeerLost on_peer_lost = nullptr) {
  std::vector<std::unique_ptr<Node>> nodes;
  std::vector<std::unique_ptr<Rendezvous>> agents;
  for (int i = 0; i < count; ++i) {
    agents.push_back(
        std::make_unique<Rendezvous>(agent_options(store, "job", range, i, 2), store.connect()));
  }
  auto rounds = rounds_in_parallel(agents);
  for (int i = 0; i < count; ++i) {
    auto n = std::make_unique<Node>();
    n->rdzv = std::move(agents[i]);
    n->round = rounds[i];
    Node* raw = n.get();
    n->watcher = std::make_unique<MembershipWatcher>(
        n->rdzv->options(), n->round, store.connect(),
        [raw](const std::string& reason) { raw->changed.set_value(reason); }, on_peer_lost);
    nodes.push_back(std::move(n));
  }
  return nodes;
}

// Stops the heartbeats of the node with `node_rank` (as if it died); returns it, or null.
Node* silence(std::vector<std::unique_ptr<Node>>& nodes, int node_rank) {
  for (auto& n : nodes) {
    if (n->round.node_rank != node_rank) continue;
    n->watcher->stop();
    return n.get();
  }
  return nullptr;
}

// The losses a --recovery step handler took (it takes every one), for the tests to wait on.
class TakenLosses {
 public:
  MembershipWatcher::OnPeerLost handler() {
    return [this](const LostPeer& p) {
      std::lock_guard<std::mutex> lock(mutex_);
      taken_.push_back(p);
      return true;
    };
  }
  // Whether `count` losses were taken within 30 s (detection: 3 missed heartbeats).
  bool wait_for(size_t count) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < deadline) {
      if (all().size() >= count) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }
  std::vector<LostPeer> all() {
    std::lock_guard<std::mutex> lock(mutex_);
    return taken_;
  }

 private:
  std::mutex mutex_;
  std::vector<LostPeer> taken_;
};

// Whether the survivors recorded `lost` (node rank `slot` of round `generation` of "job") in the
// store within 30 s: its heartbeat key reads "lost" (docs/rendezvous.md), what an arriving node
// looks for. The watcher writes it just after its loss handler returned, so a test that waited
// for the handler alone raced it (an arriving node grew the round instead, once under load).
bool wait_for_recorded_loss(const LoopbackStore& store, int64_t generation, int slot) {
  const std::string key = fmt::format("rdzv/job/{}/hb/{}", generation, slot);
  auto client = store.connect();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    if (client->check({key}) && client->get(key) == "lost") return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// A --recovery step agent ("host9", 2 workers) arriving while a round of "job" runs.
RendezvousOptions step_joiner_options(const LoopbackStore& store, NodeRange range) {
  RendezvousOptions o = agent_options(store, "job", range, 9, 2);
  o.take_lost_slots = true;
  return o;
}

TEST(RdzvMembership, SilentNodeIsDeclaredDeadAndSurvivorsReform) {
  LoopbackStore store;
  auto nodes = form_round(store, {2, 3}, 3);
  // "Kill" the node in round slot 1: its heartbeats stop.
  Node* victim = silence(nodes, 1);
  ASSERT_NE(victim, nullptr);
  for (auto& n : nodes) {
    if (n.get() == victim) continue;
    std::string reason = n->changed.get_future().get();
    EXPECT_NE(reason.find("node rank 1 (host"), std::string::npos) << reason;
    EXPECT_NE(reason.find("missed 3 heartbeats"), std::string::npos) << reason;
  }
  std::vector<std::unique_ptr<Rendezvous>> survivors;
  for (auto& n : nodes) {
    n->watcher.reset();
    if (n.get() != victim) survivors.push_back(std::move(n->rdzv));
  }
  auto rounds = rounds_in_parallel(survivors);
  for (const auto& r : rounds) {
    EXPECT_EQ(r.num_nodes, 2);
    EXPECT_EQ(r.world_size, 4);
    EXPECT_EQ(r.generation, 1);
  }
  EXPECT_NE(rounds[0].node_rank, rounds[1].node_rank);
}

// --recovery step: a lost node that the handler takes does not end the round; its slot is
// marked lost, so nobody watches or waits for it any more.
TEST(RdzvMembership, ALostNodeTakenInPlaceDoesNotEndTheRound) {
  LoopbackStore store;
  TakenLosses losses;
  auto nodes = form_round(store, {1, 3}, 3, losses.handler());
  Node* victim = silence(nodes, 1);
  ASSERT_NE(victim, nullptr);
  ASSERT_TRUE(losses.wait_for(1)) << "the lost node was never taken";
  // A few more heartbeats: the round must still not have ended.
  std::this_thread::sleep_for(victim->rdzv->options().conf.heartbeat * (kMissedHeartbeats + 2));
  const std::vector<LostPeer> taken = losses.all();
  ASSERT_EQ(taken.size(), 1u);
  EXPECT_EQ(taken[0].node_rank, 1);
  EXPECT_EQ(taken[0].first_rank, 2);  // 2 workers a node
  EXPECT_EQ(taken[0].num_ranks, 2);
  EXPECT_NE(taken[0].why.find("missed 3 heartbeats"), std::string::npos) << taken[0].why;
  for (auto& n : nodes) {
    if (n.get() == victim) continue;
    EXPECT_FALSE(n->watcher->reason().has_value()) << *n->watcher->reason();
  }
  // The round's store host (node rank 0) does not wait for the lost node at the end.
  Node* host = nullptr;
  for (auto& n : nodes) {
    if (n.get() == victim) continue;
    n->watcher->stop();
    if (n->round.node_rank == 0) {
      host = n.get();
    } else {
      n->rdzv->mark_finished();
    }
  }
  ASSERT_NE(host, nullptr);
  host->rdzv->mark_finished();
  // Below 3 heartbeats (300 ms): only the lost slot's mark makes it gone this soon.
  EXPECT_TRUE(host->rdzv->wait_for_peers_to_finish(Millis(200)));
}

// A handler that takes its time (StepRecovery promoting the job store's standby on a loaded
// machine) does not silence its own node: the peer watching that node must not take it for
// lost too. Round 0 -> 1 -> 2 -> 0: node 0 takes node 1's loss and is busy for twice the time
// after which node 2 would give it up.
TEST(RdzvMembership, ANodeBusyTakingALossKeepsItsHeartbeat) {
  LoopbackStore store;
  const Millis busy =
      agent_options(store, "job", {1, 3}, 0, 2).conf.heartbeat * (2 * kMissedHeartbeats);
  std::mutex mutex;
  std::vector<LostPeer> taken;
  auto nodes = form_round(store, {1, 3}, 3, [&](const LostPeer& p) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      taken.push_back(p);
    }
    std::this_thread::sleep_for(busy);
    return true;
  });
  Node* victim = silence(nodes, 1);
  ASSERT_NE(victim, nullptr);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  auto taken_now = [&] {
    std::lock_guard<std::mutex> lock(mutex);
    return taken;
  };
  while (taken_now().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_EQ(taken_now().size(), 1u) << "the lost node was never taken";
  // The handler's time and a few heartbeats more: still the one loss, and the round goes on.
  std::this_thread::sleep_for(busy + victim->rdzv->options().conf.heartbeat * kMissedHeartbeats);
  const std::vector<LostPeer> all = taken_now();
  ASSERT_EQ(all.size(), 1u) << "node " << all.back().node_rank
                            << " was taken as lost too: " << all.back().why;
  EXPECT_EQ(all[0].node_rank, 1);
  for (auto& n : nodes) {
    if (n.get() == victim) continue;
    EXPECT_FALSE(n->watcher->reason().has_value()) << *n->watcher->reason();
    n->watcher->stop();
  }
}

// Losses taken by several watchers at once count against the round's minimum together: with
// --nnodes 3:4, nodes 1 and 3 lost at the same moment (watched by nodes 0 and 2), one loss is
// taken in place and the other ends the round.
TEST(RdzvMembership, LossesTakenByDifferentWatchersCountAgainstTheMinimumTogether) {
  LoopbackStore store;
  std::atomic<int> taken{0};
  auto nodes = form_round(store, {3, 4}, 4, [&](const LostPeer&) {
    ++taken;
    return true;
  });
  std::vector<Node*> survivors;
  for (auto& n : nodes) {
    if (n->round.node_rank % 2 == 1) {
      n->watcher->stop();
    } else {
      survivors.push_back(n.get());
    }
  }
  for (Node* n : survivors) {
    auto changed = n->changed.get_future();
    ASSERT_EQ(changed.wait_for(std::chrono::seconds(30)), std::future_status::ready)
        << "node " << n->round.node_rank << ": the round did not end";
    const std::string reason = changed.get();
    EXPECT_NE(reason.find("missed 3 heartbeats"), std::string::npos) << reason;
  }
  EXPECT_EQ(taken.load(), 1);
}

// A node arriving after a loss taken in place that cannot take the lost node's place (one
// started without --recovery step) waits: the round ends (the worker group restarts with it,
// as for any node joining an elastic job).
TEST(RdzvMembership, ANodeArrivingAfterALossTakenInPlaceEndsTheRound) {
  LoopbackStore store;
  auto nodes = form_round(store, {1, 2}, 2, [](const LostPeer&) { return true; });
  Node* survivor = nodes[0]->round.node_rank == 0 ? nodes[0].get() : nodes[1].get();
  Node* victim = survivor == nodes[0].get() ? nodes[1].get() : nodes[0].get();
  victim->watcher->stop();
  std::this_thread::sleep_for(victim->rdzv->options().conf.heartbeat * (kMissedHeartbeats + 4));
  ASSERT_FALSE(survivor->watcher->reason().has_value()) << *survivor->watcher->reason();
  // What a node that finds round 0 running does (rendezvous.cpp): count itself in as waiting.
  store.connect()->add("rdzv/job/0/pending", 1);
  auto changed = survivor->changed.get_future();
  ASSERT_EQ(changed.wait_for(std::chrono::seconds(30)), std::future_status::ready)
      << "the waiting node did not end the round";
  const std::string reason = changed.get();
  EXPECT_NE(reason.find("1 node is waiting to join"), std::string::npos) << reason;
}

// --recovery step: a node arriving after a loss taken in place, with as many workers as the
// lost node, takes its place in the running round (same generation, node rank and ranks); the
// round goes on, the survivors watch the slot again, and its loss is taken once more.
TEST(RdzvMembership, ANodeArrivingAfterALossTakenInPlaceTakesItsPlace) {
  LoopbackStore store;
  TakenLosses losses;
  auto nodes = form_round(store, {1, 3}, 3, losses.handler());
  Node* victim = silence(nodes, 1);
  ASSERT_NE(victim, nullptr);
  ASSERT_TRUE(losses.wait_for(1)) << "the lost node was never taken";
  ASSERT_TRUE(wait_for_recorded_loss(store, victim->round.generation, victim->round.node_rank))
      << "the loss was taken but never recorded in the store";

  const RendezvousOptions o = step_joiner_options(store, {1, 3});
  Rendezvous joiner(o, store.connect());
  const RoundInfo round = joiner.next_round();
  EXPECT_TRUE(round.took_lost_slot);
  EXPECT_EQ(round.generation, victim->round.generation);
  EXPECT_EQ(round.node_rank, 1);
  EXPECT_EQ(round.num_nodes, 3);
  EXPECT_EQ(round.rank_offset, victim->round.rank_offset);
  EXPECT_EQ(round.world_size, 6);
  std::promise<std::string> joiner_changed;
  auto watcher = std::make_unique<MembershipWatcher>(
      o, round, store.connect(),
      [&](const std::string& reason) { joiner_changed.set_value(reason); },
      [](const LostPeer&) { return true; });
  std::this_thread::sleep_for(o.conf.heartbeat * (kMissedHeartbeats + 3));
  for (auto& n : nodes) {
    if (n.get() == victim) continue;
    EXPECT_FALSE(n->watcher->reason().has_value()) << *n->watcher->reason();
  }
  EXPECT_FALSE(watcher->reason().has_value()) << *watcher->reason();
  EXPECT_EQ(losses.all().size(), 1u) << "the node that took the place was taken for lost";
  // The lost node's agent, still running (a split that healed), must not start the next round:
  // that would end the one the others run.
  try {
    victim->rdzv->next_round();
    ADD_FAILURE() << "the lost node joined a round again";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("was declared lost while the round ran"),
              std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("node host9 (10.0.0.9) took its place"), std::string::npos)
        << e.what();
  }
  for (auto& n : nodes) {
    if (n.get() == victim) continue;
    EXPECT_FALSE(n->watcher->reason().has_value()) << *n->watcher->reason();
  }
  // The survivors watch the slot again: the new node's loss is seen and taken.
  watcher->stop();
  ASSERT_TRUE(losses.wait_for(2)) << "the node that took the place is not watched";
  const std::vector<LostPeer> taken = losses.all();
  EXPECT_EQ(taken[1].node_rank, 1);
  EXPECT_EQ(taken[1].first_rank, 2);
  EXPECT_NE(taken[1].why.find("host9"), std::string::npos) << taken[1].why;
}

// --recovery step: a node arriving at a running round below its maximum, with no lost place to
// take, grows it in its join slot with ranks after the round's world size; the round goes on,
// the ring watches the new node (its loss is taken like any node's), and the store's host waits
// for it at the end.
TEST(RdzvMembership, ANodeArrivingWithNoLostPlaceGrowsTheRunningRound) {
  LoopbackStore store;
  TakenLosses losses;
  auto nodes = form_round(store, {2, 3}, 2, losses.handler());
  const RendezvousOptions o = step_joiner_options(store, {2, 3});
  Rendezvous joiner(o, store.connect());
  const RoundInfo round = joiner.next_round();
  EXPECT_TRUE(round.grew_round);
  EXPECT_FALSE(round.took_lost_slot);
  EXPECT_EQ(round.generation, nodes[0]->round.generation);
  EXPECT_EQ(round.node_rank, 2);
  EXPECT_EQ(round.num_nodes, 3);
  EXPECT_EQ(round.formed_nodes, 2);
  EXPECT_EQ(round.launch_world_size, 4);
  EXPECT_EQ(round.rank_offset, 4);
  EXPECT_EQ(round.world_size, 6);
  std::promise<std::string> joiner_changed;
  auto watcher = std::make_unique<MembershipWatcher>(
      o, round, store.connect(),
      [&](const std::string& reason) { joiner_changed.set_value(reason); }, losses.handler());
  std::this_thread::sleep_for(o.conf.heartbeat * (kMissedHeartbeats + 3));
  for (auto& n : nodes) {
    EXPECT_FALSE(n->watcher->reason().has_value()) << *n->watcher->reason();
  }
  EXPECT_FALSE(watcher->reason().has_value()) << *watcher->reason();
  EXPECT_TRUE(losses.all().empty()) << "a node was taken for lost: " << losses.all()[0].why;

  // The store's host waits for the grown node too.
  Node* host = nodes[0]->round.node_rank == 0 ? nodes[0].get() : nodes[1].get();
  Node* other = host == nodes[0].get() ? nodes[1].get() : nodes[0].get();
  other->watcher->stop();
  other->rdzv->mark_finished();
  EXPECT_FALSE(host->rdzv->wait_for_peers_to_finish(Millis(300)))
      << "the store's host did not wait for the node that grew the round";

  // The ring watches it: its silence is a loss taken in place, with its own ranks.
  watcher->stop();
  ASSERT_TRUE(losses.wait_for(1)) << "the node that grew the round is not watched";
  const LostPeer lost = losses.all()[0];
  EXPECT_EQ(lost.node_rank, 2);
  EXPECT_EQ(lost.first_rank, 4);
  EXPECT_EQ(lost.num_ranks, 2);
  EXPECT_NE(lost.why.find("host9"), std::string::npos) << lost.why;
  EXPECT_TRUE(host->rdzv->wait_for_peers_to_finish(Millis(300)));
}

// A round at its maximum does not grow: a node arriving waits for the next round (here until
// its join_timeout) and the running round goes on.
TEST(RdzvMembership, ANodeArrivingAtAFullRoundDoesNotGrowIt) {
  LoopbackStore store;
  TakenLosses losses;
  auto nodes = form_round(store, {1, 2}, 2, losses.handler());
  RendezvousOptions o = step_joiner_options(store, {1, 2});
  o.conf.join_timeout = 2s;
  Rendezvous joiner(o, store.connect());
  EXPECT_THROW(joiner.next_round(), RendezvousTimeoutError);
  for (auto& n : nodes) {
    EXPECT_FALSE(n->watcher->reason().has_value()) << *n->watcher->reason();
  }
  EXPECT_EQ(store.connect()->add("rdzv/job/0/grown", 0), 0);
}

// Without a handler's consent, or below the round's minimum, a lost node ends the round.
TEST(RdzvMembership, ALostNodeBelowTheMinimumEndsTheRound) {
  LoopbackStore store;
  std::atomic<int> asked{0};
  auto nodes = form_round(store, {2, 2}, 2, [&](const LostPeer&) {
    ++asked;
    return true;
  });
  nodes[1]->watcher->stop();
  const std::string reason = nodes[0]->changed.get_future().get();
  EXPECT_NE(reason.find("missed 3 heartbeats"), std::string::npos) << reason;
  EXPECT_EQ(asked.load(), 0);
}

TEST(RdzvMembership, LeavingNodeIsSeenByEveryone) {
  LoopbackStore store;
  auto nodes = form_round(store, {1, 3}, 3);
  nodes[2]->watcher->stop();
  nodes[2]->rdzv->mark_left("host2 was interrupted (SIGINT)");
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(nodes[i]->changed.get_future().get(), "host2 was interrupted (SIGINT)");
  }
}

TEST(RdzvMembership, FinishedNodeIsNotDeclaredDead) {
  LoopbackStore store;
  auto nodes = form_round(store, {2, 2}, 2);
  // Node 1 finishes; node 0 keeps running for more than kMissedHeartbeats periods.
  nodes[1]->watcher->stop();
  nodes[1]->rdzv->mark_finished();
  std::this_thread::sleep_for(nodes[0]->rdzv->options().conf.heartbeat * (kMissedHeartbeats + 3));
  EXPECT_FALSE(nodes[0]->watcher->reason().has_value()) << *nodes[0]->watcher->reason();
  nodes[0]->watcher->stop();
  nodes[0]->rdzv->mark_finished();
  EXPECT_TRUE(nodes[0]->rdzv->wait_for_peers_to_finish(Millis(5000)));
}

TEST(RdzvMembership, RequestedNewRoundWakesEveryWatcher) {
  LoopbackStore store;
  auto nodes = form_round(store, {2, 2}, 2);
  nodes[0]->rdzv->request_new_round("worker local_rank 1 (RANK 1) on host0 exited with 3");
  EXPECT_EQ(nodes[1]->changed.get_future().get(),
            "worker local_rank 1 (RANK 1) on host0 exited with 3");
}

TEST(RdzvMembership, HostWaitsForPeersThatStillHeartbeat) {
  LoopbackStore store;
  auto nodes = form_round(store, {2, 2}, 2);
  // Node 1 keeps heartbeating: the host must not consider it finished.
  EXPECT_FALSE(nodes[0]->rdzv->wait_for_peers_to_finish(Millis(600)));
  nodes[1]->watcher->stop();
  nodes[1]->rdzv->mark_finished();
  EXPECT_TRUE(nodes[0]->rdzv->wait_for_peers_to_finish(Millis(5000)));
}

}  // namespace
}  // namespace ddp::rdzv::test
