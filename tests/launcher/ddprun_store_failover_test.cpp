// ddprun end to end: a c10d job outlives the agent that serves its rendezvous store. Three
// agents of one job on loopback (three "nodes", --nnodes 2:3, one worker each); the agent
// serving the store is killed with SIGKILL while the workers run. The two others move to the
// round's first standby store (one of them serves it from then on), form the next round of 2
// nodes there, start their workers again and end 0. With --rdzv-conf standby_stores=0 they
// end with the lost store instead, as torchrun's agents do.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "../support/free_port_range.hpp"
#include "launcher_fixture.hpp"

namespace ddp::launcher::testing {
namespace {

using Clock = std::chrono::steady_clock;

// Round 0 (3 nodes) sleeps until stopped; a round of 2 nodes exits 0 at once.
const std::vector<std::string> kWorker = {
    "--no-python", "/bin/sh", "-c",
    "echo \"worker RANK=$RANK WORLD_SIZE=$WORLD_SIZE\"; [ \"$GROUP_WORLD_SIZE\" = 3 ] && exec "
    "sleep 120; exit 0"};

class DdprunStoreFailover : public LauncherTest {
 protected:
  struct Agent {
    pid_t pid = -1;
    std::string err_path;
    std::string out_path;
  };

  // Starts the agent that serves the store, then two more, and waits (bounded) until all three
  // are in round 0. Another program may take the port between the probe and the bind (the
  // first agent then says it joins that server as a client): then everything starts again on
  // another port. Empty, with a test failure showing the agents' stderr, otherwise.
  // `worker`: the command after ddprun's flags; `first_env`: extra environment of the agent
  // serving the store (its workers inherit it).
  std::vector<Agent> start_three_nodes(const std::string& run_id, const std::string& conf,
                                       const std::vector<std::string>& worker = kWorker,
                                       const EnvPairs& first_env = {}) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      const std::string endpoint =
          "127.0.0.1:" + std::to_string(ddp::test::free_ports_below_ephemeral_range());
      std::vector<std::string> args = {"--nnodes",       "2:3",  "--nproc-per-node", "1",
                                       "--rdzv-backend", "c10d", "--rdzv-endpoint",  endpoint,
                                       "--rdzv-id",      run_id, "--rdzv-conf",      conf};
      args.insert(args.end(), worker.begin(), worker.end());
      std::vector<Agent> agents;
      {
        const pid_t pid = start(args, first_env);
        agents.push_back({pid, current_err_path(), current_out_path()});
      }
      if (!wait_until({agents[0]}, "waiting for the other nodes") ||
          read_file(agents[0].err_path).find("served by this node") == std::string::npos) {
        stop_all(agents);
        continue;
      }
      for (int n = 1; n < 3; ++n) {
        const pid_t pid = start(args);
        agents.push_back({pid, current_err_path(), current_out_path()});
      }
      if (wait_until(agents, "rendezvous round 0 of run '" + run_id + "': 3 nodes")) {
        return agents;
      }
      ADD_FAILURE() << "the 3 agents did not form round 0 in 60 s;\n" << stderr_of(agents);
      stop_all(agents);
      return {};
    }
    ADD_FAILURE() << "another program took the rendezvous port three times";
    return {};
  }

  // Until every agent's stderr (or stdout: `in_stdout`) contains `text` (60 s at most).
  bool wait_until(const std::vector<Agent>& agents, const std::string& text,
                  bool in_stdout = false) {
    const auto until = Clock::now() + std::chrono::seconds(60);
    for (;;) {
      bool all = true;
      for (const auto& a : agents) {
        const std::string& path = in_stdout ? a.out_path : a.err_path;
        all = all && read_file(path).find(text) != std::string::npos;
      }
      if (all) return true;
      if (Clock::now() > until) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }

  static std::string stderr_of(const std::vector<Agent>& agents) {
    std::string out;
    for (size_t i = 0; i < agents.size(); ++i) {
      out += "agent " + std::to_string(i) + "'s stderr:\n" + read_file(agents[i].err_path) + "\n";
    }
    return out;
  }

  void stop_all(const std::vector<Agent>& agents) {
    for (const auto& a : agents) ::kill(a.pid, SIGKILL);
    for (const auto& a : agents) wait(a.pid, 30);
  }

  // Kills the agent serving the store (its workers die with it: PR_SET_PDEATHSIG) and returns
  // the two survivors' results.
  std::vector<RunResult> kill_the_store_host(const std::vector<Agent>& agents) {
    ::kill(agents[0].pid, SIGKILL);
    wait(agents[0].pid, 30);
    return {wait(agents[1].pid, 90), wait(agents[2].pid, 90)};
  }
};

TEST_F(DdprunStoreFailover, JobOutlivesTheAgentServingTheStore) {
  const auto agents =
      start_three_nodes("failover", "join_timeout=60,last_call_timeout=1,heartbeat=1");
  ASSERT_EQ(agents.size(), 3u);
  // Round 0's workers have printed before the kill (a loaded CI once killed the store host
  // before the shell in its round-0 worker had echoed: one "worker RANK=" line, not two).
  if (!wait_until(agents, "WORLD_SIZE=3", /*in_stdout=*/true)) {
    stop_all(agents);
    FAIL() << "round 0's workers did not print in 60 s;\n" << stderr_of(agents);
  }
  const std::vector<RunResult> survivors = kill_the_store_host(agents);

  int serving = 0, moved = 0;
  for (const RunResult& r : survivors) {
    EXPECT_EQ(r.exit_code, 0) << r.err;
    EXPECT_NE(r.err.find("lost the rendezvous store at 127.0.0.1:"), std::string::npos) << r.err;
    EXPECT_NE(r.err.find("moving to the job's standby store (in order: "), std::string::npos)
        << r.err;
    const size_t round1 = r.err.find("rendezvous round 1 of run 'failover': 2 nodes");
    EXPECT_NE(round1, std::string::npos) << r.err;
    EXPECT_LT(r.err.find("moving to the job's standby store"), round1) << r.err;
    serving += r.err.find("this node serves the rendezvous store now") != std::string::npos;
    moved += r.err.find("moved to the rendezvous store at 127.0.0.1:") != std::string::npos;
    EXPECT_EQ(lines_with(r.out, "worker RANK=").size(), 2u) << r.out << r.err;
    EXPECT_EQ(lines_with(r.out, "WORLD_SIZE=2").size(), 1u) << r.out << r.err;
  }
  // The round's first standby belongs to one survivor: it serves, the other moves to it.
  EXPECT_EQ(serving, 1) << survivors[0].err << "\n" << survivors[1].err;
  EXPECT_EQ(moved, 1) << survivors[0].err << "\n" << survivors[1].err;
  expect_no_survivors();
}

TEST_F(DdprunStoreFailover, WithoutStandbyStoresTheJobEndsWithItsStoreHost) {
  const auto agents = start_three_nodes("nostandby",
                                        "join_timeout=60,last_call_timeout=1,heartbeat=1,"
                                        "connect_timeout=1,standby_stores=0");
  ASSERT_EQ(agents.size(), 3u);
  for (const RunResult& r : kill_the_store_host(agents)) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("lost the rendezvous store at 127.0.0.1:"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("standby store"), std::string::npos) << r.err;
    EXPECT_EQ(r.err.find("rendezvous round 1"), std::string::npos) << r.err;
  }
  expect_no_survivors();
}

// The agent serving the store gives up (its worker failed, no restart left) and shuts the run
// down: the other nodes must read that before the store goes. Before, it exited at once; a
// peer that had not read the reason took the store for lost, moved to its standby store and
// waited there for nodes that never came (the join timeout: 600 s by default).
TEST_F(DdprunStoreFailover, AShutDownByTheAgentServingTheStoreReachesTheOthers) {
  const std::vector<std::string> worker = {
      "--no-python", "/bin/sh", "-c",
      "[ \"$FAIL_ON_THIS_NODE\" = 1 ] && [ \"$GROUP_WORLD_SIZE\" = 3 ] && exit 3; exec sleep 120"};
  const auto agents = start_three_nodes("shutdown", "join_timeout=120,heartbeat=1", worker,
                                        {{"FAIL_ON_THIS_NODE", "1"}});
  ASSERT_EQ(agents.size(), 3u);
  const auto started = Clock::now();
  std::vector<RunResult> results;
  for (const auto& a : agents) results.push_back(wait(a.pid, 100));
  std::printf("all three agents ended %.1f s after round 0\n",
              std::chrono::duration<double>(Clock::now() - started).count());
  EXPECT_EQ(results[0].exit_code, 1) << results[0].err;
  EXPECT_NE(results[0].err.find("FAILED"), std::string::npos) << results[0].err;
  for (int n = 1; n < 3; ++n) {
    const RunResult& r = results[n];
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("run 'shutdown' was shut down by one of its agents: "), std::string::npos)
        << r.err;
    EXPECT_EQ(r.err.find("moving to the job's standby store"), std::string::npos) << r.err;
  }
}

}  // namespace
}  // namespace ddp::launcher::testing
