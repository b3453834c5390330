// ddprun end to end: what a node says while it waits for the other nodes of a multi-node job
// (a line when the wait starts and one every DDPRUN_RDZV_PROGRESS_S seconds: the store
// endpoint, whether this node serves it, k of n nodes arrived, the limit and its flag), and
// the one error it ends with at join_timeout. The other nodes are never started.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "../support/free_port_range.hpp"
#include "launcher_fixture.hpp"

namespace ddp::launcher::testing {
namespace {

using DdprunRendezvousWait = LauncherTest;

// Short waits so the test takes seconds; the lines counted below are a lower bound that a
// loaded machine still meets (about 7 progress lines are due in the 4 s join limit).
const EnvPairs kFastProgress = {{"DDPRUN_RDZV_PROGRESS_S", "0.5"}};
constexpr const char* kJoinLimit = "join_timeout=4";

TEST_F(DdprunRendezvousWait, StaticNodeSaysWhatItWaitsForThenGivesUp) {
  // Static: the agents' store is at MASTER_PORT + 1, served by node 0 (this one).
  const int port = ddp::test::free_ports_below_ephemeral_range(2);
  const std::string endpoint = "127.0.0.1:" + std::to_string(port + 1);
  RunResult r =
      run({"--nnodes", "2", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
           std::to_string(port), "--rdzv-conf", kJoinLimit, worker(), "env"},
          kFastProgress, 60);

  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_TRUE(lines_with(r.out, "ENV ").empty()) << "no worker may start:\n" << r.out;

  const std::vector<std::string> start = lines_with(r.err, "ddprun: waiting for the other nodes");
  ASSERT_EQ(start.size(), 1u) << r.err;
  EXPECT_NE(start[0].find("static run 'none' (2 nodes)"), std::string::npos) << start[0];
  EXPECT_NE(start[0].find(endpoint + ", served by this node (node rank 0)"), std::string::npos)
      << start[0];
  EXPECT_NE(start[0].find("giving up after 4 s (--rdzv-conf join_timeout=SECONDS)"),
            std::string::npos)
      << start[0];

  const std::vector<std::string> progress =
      lines_with(r.err, "ddprun: still waiting for the other nodes");
  ASSERT_GE(progress.size(), 2u) << r.err;
  for (const auto& line : progress) {
    EXPECT_NE(line.find("1 of 2 nodes arrived (missing: node rank 1)"), std::string::npos) << line;
    EXPECT_NE(line.find(endpoint + ", served by this node"), std::string::npos) << line;
    EXPECT_NE(line.find("giving up after 4 s (--rdzv-conf join_timeout=SECONDS)"),
              std::string::npos)
        << line;
  }

  // The one error at the limit: the cause (node rank 1 never arrived) and the fixes.
  EXPECT_EQ(lines_with(r.err, "ddprun: error:").size(), 1u) << r.err;
  EXPECT_NE(r.err.find("ddprun: error: rendezvous timed out waiting for nodes to join: 1 of 2 "
                       "nodes joined run 'none' at endpoint " +
                       endpoint),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("missing: node rank 1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("the missing node's ddprun was not started"), std::string::npos) << r.err;
  // No progress line after the error: the reporter stops when the wait ends.
  EXPECT_EQ(r.err.find("waiting for the other nodes", r.err.find("ddprun: error:")),
            std::string::npos)
      << r.err;
  expect_no_survivors();
}

// c10d waits the same way; the line names the backend and the node range (arrivals are
// counted for the static backend only, see join_progress.hpp).
TEST_F(DdprunRendezvousWait, C10dNodeSaysWhatItWaitsFor) {
  const std::string endpoint =
      "127.0.0.1:" + std::to_string(ddp::test::free_ports_below_ephemeral_range(1));
  RunResult r = run({"--nnodes", "2:3", "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                     "--rdzv-conf", "join_timeout=2", worker(), "env"},
                    kFastProgress, 60);

  EXPECT_EQ(r.exit_code, 1) << r.err;
  const std::vector<std::string> start = lines_with(r.err, "ddprun: waiting for the other nodes");
  ASSERT_EQ(start.size(), 1u) << r.err;
  EXPECT_NE(start[0].find("c10d run 'none' (2 to 3 nodes)"), std::string::npos) << start[0];
  EXPECT_NE(start[0].find(endpoint + ", served by this node"), std::string::npos) << start[0];
  EXPECT_NE(start[0].find("giving up after 2 s"), std::string::npos) << start[0];
  EXPECT_GE(lines_with(r.err, "ddprun: still waiting for the other nodes").size(), 1u) << r.err;
  EXPECT_NE(r.err.find("ddprun: error: rendezvous timed out waiting for nodes to join"),
            std::string::npos)
      << r.err;
  expect_no_survivors();
}

}  // namespace
}  // namespace ddp::launcher::testing
