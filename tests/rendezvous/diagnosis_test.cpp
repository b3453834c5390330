// The timeout diagnosis: the pinned message, and what real timeouts report (joined hosts,
// missing ranks, other run ids at the endpoint).
#include <gtest/gtest.h>

#include "rdzv_test_util.hpp"

namespace ddp::rdzv::test {
namespace {

TEST(RdzvDiagnosis, MessageIsPinned) {
  TimeoutDiagnosis d;
  d.endpoint = "10.78.0.1:29400";
  d.run_id = "job42";
  d.generation = 0;
  d.min_nodes = 3;
  d.max_nodes = 3;
  d.joined = {{0, "node-a", "10.78.0.1", 2}, {1, "node-b", "10.78.0.2", 1}};
  d.joined_count = 2;
  d.missing_ranks = {2};
  d.waited = Millis(10020);
  d.limit = Millis(10000);
  EXPECT_EQ(format_timeout_diagnosis(d),
            "rendezvous timed out waiting for nodes to join: 2 of 3 nodes joined run 'job42' at "
            "endpoint 10.78.0.1:29400 (backend c10d, round 0) after waiting 10.0 s (join_timeout "
            "10.0 s)\n"
            "  joined:\n"
            "    node rank 0: node-a (10.78.0.1, 2 workers)\n"
            "    node rank 1: node-b (10.78.0.2, 1 worker)\n"
            "  missing: node rank 2 (c10d assigns node ranks in join order)\n"
            "  likely causes, most likely first:\n"
            "    1. the missing node's ddprun was not started (or exited): check its job step, "
            "ssh session or its own error output\n"
            "    2. the missing node was started with a different --rdzv-id: every node must "
            "pass --rdzv-id job42\n"
            "    3. the endpoint 10.78.0.1:29400 is unreachable from the missing node: run "
            "`ddprun doctor --rdzv-endpoint 10.78.0.1:29400` there\n"
            "    4. a firewall blocks the port, or the endpoint name resolves to the wrong "
            "interface on that node: pass a routable address in --rdzv-endpoint (and "
            "--local-addr)");
}

TEST(RdzvDiagnosis, OtherRunIdComesFirstAndIsNamed) {
  TimeoutDiagnosis d;
  d.endpoint = "h:1";
  d.run_id = "a";
  d.min_nodes = 2;
  d.max_nodes = 4;
  d.joined_count = 1;
  d.joined = {{0, "x", "1.1.1.1", 1}};
  d.missing_ranks = {1};
  d.other_runs = {{"b", {"y"}}};
  std::string m = format_timeout_diagnosis(d);
  EXPECT_NE(m.find("1 of 2 (at least 2, at most 4) nodes joined"), std::string::npos) << m;
  EXPECT_NE(m.find("  agents at this endpoint used --rdzv-id b (from y)\n"), std::string::npos)
      << m;
  EXPECT_NE(m.find("    1. a node was started with a different --rdzv-id (b instead of a)"),
            std::string::npos)
      << m;
}

TEST(RdzvDiagnosis, TimeoutNamesJoinedHostsAndMissingRanks) {
  LoopbackStore store;
  std::vector<std::unique_ptr<Rendezvous>> agents;
  for (int i = 0; i < 2; ++i) {
    auto o = agent_options(store, "job", {3, 3}, i, 2);
    o.conf.join_timeout = 700ms;
    agents.push_back(std::make_unique<Rendezvous>(o, store.connect()));
  }
  std::vector<std::future<std::string>> f;
  for (auto& a : agents) {
    f.push_back(std::async(std::launch::async, [&a]() -> std::string {
      try {
        a->next_round();
      } catch (const RendezvousTimeoutError& e) {
        return e.what();
      }
      return "no timeout";
    }));
  }
  for (auto& x : f) {
    std::string m = x.get();
    EXPECT_NE(m.find("rendezvous timed out waiting for nodes to join: 2 of 3 nodes joined run "
                     "'job' at endpoint 127.0.0.1:" +
                     std::to_string(store.port())),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("node rank 0: host"), std::string::npos) << m;
    EXPECT_NE(m.find("missing: node rank 2 "), std::string::npos) << m;
    EXPECT_NE(m.find("(join_timeout 0.7 s)"), std::string::npos) << m;
  }
}

TEST(RdzvDiagnosis, TimeoutNamesTheOtherRunIdSeenAtTheEndpoint) {
  LoopbackStore store;
  auto oa = agent_options(store, "job", {2, 2}, 0);
  oa.conf.join_timeout = 700ms;
  auto ob = agent_options(store, "jbo", {2, 2}, 1);
  ob.hostname = "typo-node";
  ob.conf.join_timeout = 700ms;
  Rendezvous a(oa, store.connect()), b(ob, store.connect());
  auto fb = std::async(std::launch::async, [&] {
    try {
      b.next_round();
    } catch (const RendezvousTimeoutError&) {
    }
  });
  try {
    a.next_round();
    FAIL() << "expected a timeout";
  } catch (const RendezvousTimeoutError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("1 of 2 nodes joined run 'job'"), std::string::npos) << m;
    EXPECT_NE(m.find("agents at this endpoint used --rdzv-id jbo (from typo-node)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("1. a node was started with a different --rdzv-id (jbo instead of job)"),
              std::string::npos)
        << m;
  }
  fb.get();
}

TEST(RdzvDiagnosis, StaticNamesTheMissingNodeRanks) {
  LoopbackStore store;
  auto o = agent_options(store, "job", {4, 4}, 0);
  o.backend = Backend::kStatic;
  o.node_rank = 0;
  o.conf.join_timeout = 500ms;
  auto o2 = o;
  o2.node_rank = 2;
  o2.hostname = "host2";
  Rendezvous a(o, store.connect()), c(o2, store.connect());
  auto fc = std::async(std::launch::async, [&] {
    try {
      c.next_round();
    } catch (const RendezvousTimeoutError&) {
    }
  });
  try {
    a.next_round();
    FAIL() << "expected a timeout";
  } catch (const RendezvousTimeoutError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("missing: node ranks 1, 3\n"), std::string::npos) << m;
    EXPECT_NE(m.find("node rank 2: host2"), std::string::npos) << m;
    EXPECT_EQ(e.diagnosis().missing_ranks, (std::vector<int>{1, 3}));
  }
  fc.get();
}

}  // namespace
}  // namespace ddp::rdzv::test
