// ddprun end to end: the worker environment contract, flag spellings, PET_* fallbacks, and
// bad command lines.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include <fstream>
#include <map>
#include <sstream>

#include "../support/free_port_range.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"
#include "launcher_fixture.hpp"

namespace ddp::launcher::testing {
namespace {

// "ENV K=V K=V ..." lines -> one map per RANK.
std::map<int, std::map<std::string, std::string>> env_lines(const std::string& out) {
  std::map<int, std::map<std::string, std::string>> by_rank;
  for (const auto& line : lines_with(out, "ENV ")) {
    std::istringstream in(line.substr(line.find("ENV ") + 4));
    std::map<std::string, std::string> kv;
    std::string item;
    while (in >> item) {
      auto eq = item.find('=');
      kv[item.substr(0, eq)] = item.substr(eq + 1);
    }
    by_rank[std::stoi(kv["RANK"])] = kv;
  }
  return by_rank;
}

using DdprunEnv = LauncherTest;

TEST_F(DdprunEnv, ThreeWorkersGetTheTorchrunContract) {
  RunResult r =
      run({"--nproc-per-node", "3", "--max-restarts", "2", "--run-id", "job7", "--role", "trainer",
           "--master-addr", "127.0.0.1", "--master-port", "29555", worker(), "env"},
          {{"TORCHELASTIC_USE_AGENT_STORE", "True"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ranks = env_lines(r.out);
  ASSERT_EQ(ranks.size(), 3u) << r.out;
  for (int rank = 0; rank < 3; ++rank) {
    auto& e = ranks[rank];
    EXPECT_EQ(e["LOCAL_RANK"], std::to_string(rank));
    EXPECT_EQ(e["ROLE_RANK"], std::to_string(rank));
    EXPECT_EQ(e["WORLD_SIZE"], "3");
    EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "3");
    EXPECT_EQ(e["ROLE_WORLD_SIZE"], "3");
    EXPECT_EQ(e["GROUP_RANK"], "0");
    EXPECT_EQ(e["GROUP_WORLD_SIZE"], "1");
    EXPECT_EQ(e["ROLE_NAME"], "trainer");
    EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
    EXPECT_EQ(e["MASTER_PORT"], "29555");
    EXPECT_EQ(e["TORCHELASTIC_RESTART_COUNT"], "0");
    EXPECT_EQ(e["TORCHELASTIC_MAX_RESTARTS"], "2");
    EXPECT_EQ(e["TORCHELASTIC_RUN_ID"], "job7");
    EXPECT_NE(
        e["TORCHELASTIC_ERROR_FILE"].find("/attempt_0/" + std::to_string(rank) + "/error.json"),
        std::string::npos)
        << e["TORCHELASTIC_ERROR_FILE"];
    EXPECT_EQ(e["OMP_NUM_THREADS"], "1");
    // Left unset so PyTorch's rank 0 hosts the TCPStore itself.
    EXPECT_EQ(e["TORCHELASTIC_USE_AGENT_STORE"], "<unset>");
  }
  EXPECT_NE(r.err.find("OMP_NUM_THREADS=1"), std::string::npos) << r.err;
}

// --rdzv-conf token_file= guards the agents' store, and the workers get the file's path
// (DDP_STORE_TOKEN_FILE, absolute) so the stores ddp opens in them (rank 0's
// MASTER_ADDR:MASTER_PORT store) require the same token; the token itself is not exported.
TEST_F(DdprunEnv, RendezvousTokenFileReachesTheWorkers) {
  std::string token_file = dir() + "/token";
  { std::ofstream(token_file) << "job-secret\n"; }
  ::chmod(token_file.c_str(), 0600);  // a token file others can read is refused
  std::string port = std::to_string(ddp::test::free_ports_below_ephemeral_range());
  RunResult r =
      run({"--nnodes", "1", "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
           "127.0.0.1:" + port, "--rdzv-conf", "token_file=" + token_file, worker(), "env"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ranks = env_lines(r.out);
  ASSERT_EQ(ranks.size(), 2u) << r.out;
  for (auto& [rank, e] : ranks) EXPECT_EQ(e["DDP_STORE_TOKEN_FILE"], token_file) << rank;
  EXPECT_EQ(r.out.find("job-secret"), std::string::npos) << r.out;

  // Without token_file nothing is added.
  port = std::to_string(ddp::test::free_ports_below_ephemeral_range());
  r = run({"--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:" + port,
           worker(), "env"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ranks = env_lines(r.out);
  ASSERT_EQ(ranks.size(), 1u) << r.out;
  EXPECT_EQ(ranks[0]["DDP_STORE_TOKEN_FILE"], "<unset>");
}

// Static multi-node: the workers' MASTER_ADDR is the user's --master-addr, as with torchrun,
// never the address the node-0 agent found for itself (which can be loopback: the route to its
// own name, or Debian's "127.0.1.1 hostname" line in /etc/hosts, and remote workers would then
// connect to themselves). Two agents on this machine stand for two nodes.
TEST_F(DdprunEnv, StaticMultiNodeKeepsTheExplicitMasterAddr) {
  const int port = ddp::test::free_ports_below_ephemeral_range(2);
  std::vector<pid_t> agents;
  for (int node = 0; node < 2; ++node) {
    agents.push_back(start({"--nnodes", "2", "--node-rank", std::to_string(node), "--master-addr",
                            "localhost", "--master-port", std::to_string(port), worker(), "env"}));
  }
  std::map<int, std::map<std::string, std::string>> ranks;
  for (size_t i = 0; i < agents.size(); ++i) {
    // wait() returns the output of the last agent started; each run has its own files.
    const std::string out = dir() + "/ddprun." + std::to_string(i + 1);
    RunResult r = wait(agents[i]);
    ASSERT_EQ(r.exit_code, 0) << read_file(out + ".err");
    for (auto& [rank, e] : env_lines(read_file(out + ".out"))) ranks[rank] = e;
  }
  ASSERT_EQ(ranks.size(), 2u);
  for (auto& [rank, e] : ranks) {
    EXPECT_EQ(e["MASTER_ADDR"], "localhost") << "rank " << rank;
    EXPECT_EQ(e["MASTER_PORT"], std::to_string(port)) << "rank " << rank;
  }
}

TEST_F(DdprunEnv, UserOmpThreadsAndSingleWorkerAreLeftAlone) {
  RunResult r = run({"--nproc-per-node", "2", worker(), "env"}, {{"OMP_NUM_THREADS", "4"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (auto& [rank, e] : env_lines(r.out)) EXPECT_EQ(e["OMP_NUM_THREADS"], "4");
  r = run({worker(), "env"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ranks = env_lines(r.out);
  ASSERT_EQ(ranks.size(), 1u);
  EXPECT_EQ(ranks[0]["OMP_NUM_THREADS"], "<unset>");
  EXPECT_EQ(ranks[0]["MASTER_PORT"], "29500");
  EXPECT_EQ(ranks[0]["ROLE_NAME"], "default");
  EXPECT_EQ(ranks[0]["TORCHELASTIC_RUN_ID"], "none");
}

TEST_F(DdprunEnv, UnderscoreSpellingsAndPetFallbacks) {
  RunResult r =
      run({"--nproc_per_node", "2", "--master_port=31001", "--max_restarts", "1", worker(), "env"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ranks = env_lines(r.out);
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_EQ(ranks[1]["MASTER_PORT"], "31001");
  EXPECT_EQ(ranks[1]["TORCHELASTIC_MAX_RESTARTS"], "1");

  r = run({worker(), "env"},
          {{"PET_NPROC_PER_NODE", "3"}, {"PET_MASTER_PORT", "31002"}, {"PET_ROLE", "env_role"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ranks = env_lines(r.out);
  ASSERT_EQ(ranks.size(), 3u);
  EXPECT_EQ(ranks[2]["MASTER_PORT"], "31002");
  EXPECT_EQ(ranks[2]["ROLE_NAME"], "env_role");

  // A flag beats its PET_ variable.
  r = run({"--nproc-per-node", "1", worker(), "env"}, {{"PET_NPROC_PER_NODE", "3"}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(env_lines(r.out).size(), 1u);
}

TEST_F(DdprunEnv, StandalonePicksAFreePortAndARunId) {
  RunResult r = run({"--standalone", "--nproc-per-node", "2", worker(), "env"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ranks = env_lines(r.out);
  ASSERT_EQ(ranks.size(), 2u);
  EXPECT_NE(ranks[0]["MASTER_PORT"], "29500");
  EXPECT_EQ(ranks[0]["MASTER_PORT"], ranks[1]["MASTER_PORT"]);
  EXPECT_NE(ranks[0]["TORCHELASTIC_RUN_ID"], "none");
  EXPECT_EQ(ranks[0]["TORCHELASTIC_RUN_ID"].size(), 36u) << ranks[0]["TORCHELASTIC_RUN_ID"];
}

TEST_F(DdprunEnv, ArgumentsAfterProgramAreUntouched) {
  RunResult r =
      run({"--nproc-per-node", "1", worker(), "print", "--nproc-per-node", "print", "-- -r 3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "--nproc-per-node\n-- -r 3\n");
}

TEST_F(DdprunEnv, BadCommandLinesExitTwoNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    EnvPairs env;
    std::string expected;
  };
  std::vector<Case> cases = {
      {{"--bogus", worker()}, {}, "unknown flag '--bogus'"},
      {{"--nproc-per-nod", "2", worker()}, {}, "did you mean '--nproc-per-node'"},
      {{"--nproc-per-node", "zero", worker()},
       {},
       "--nproc-per-node: 'zero' is not a worker count"},
      {{"--nproc-per-node", "0", worker()}, {}, "--nproc-per-node: '0'"},
      {{"--nproc-per-node"}, {}, "--nproc-per-node"},
      {{worker()}, {{"PET_NPROC_PER_NODE", "x"}}, "PET_NPROC_PER_NODE: 'x'"},
      {{"--nnodes", "3", "--node-rank", "3", worker()}, {}, "--node-rank 3 is outside [0, 3)"},
      {{"--nnodes", "1:4", worker()}, {}, "an elastic node range needs --rdzv-backend c10d"},
      {{"--master-port", "70000", worker()}, {}, "--master-port: '70000' is not a TCP port"},
      {{"--max-restarts", "-1", worker()}, {}, "--max-restarts: '-1'"},
      {{"-r", "7", worker()}, {}, "--redirects: '7' is not a stream selector"},
      {{"--tee", "0:5", worker()}, {}, "--tee: '0:5'"},
      {{"--local-ranks-filter", "a", worker()}, {}, "--local-ranks-filter: 'a'"},
      {{"--monitor-interval", "0", worker()}, {}, "--monitor-interval: '0'"},
      {{"-m", "--no-python", "x"}, {}, "cannot be used together"},
      {{"--rdzv-backend", "c10d", worker()}, {}, "c10d needs --rdzv-endpoint HOST[:PORT]"},
      {{}, {}, "no PROGRAM given"},
      {{"/nonexistent/prog"}, {}, "'/nonexistent/prog' does not exist"},
      {{"no-such-program-ddprun"}, {}, "was not found on PATH"},
      {{worker()}, {{"DDPRUN_TERM_GRACE_S", "soon"}}, "DDPRUN_TERM_GRACE_S=soon"},
      {{worker()}, {{"DDPRUN_RDZV_PROGRESS_S", "0"}}, "DDPRUN_RDZV_PROGRESS_S=0: expected seconds"},
      {{"--log-dir", "/proc/no-logs-here", worker()}, {}, "--log-dir: cannot create"},
  };
  for (const auto& c : cases) {
    RunResult r = run(c.args, c.env);
    std::string joined;
    for (const auto& a : c.args) joined += a + " ";
    EXPECT_EQ(r.exit_code, 2) << joined << "\n" << r.err;
    EXPECT_NE(r.err.find(c.expected), std::string::npos)
        << "args: " << joined << "\nexpected: " << c.expected << "\ngot: " << r.err;
    EXPECT_EQ(r.out, "") << joined;
  }
}

TEST_F(DdprunEnv, HelpExitsZero) {
  RunResult r = run({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("--nproc-per-node"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("PET_NPROC_PER_NODE"), std::string::npos) << r.out;
}

// A stand-in `python3` that prints who it is and its arguments.
std::string fake_python(const std::string& dir, const std::string& name) {
  ::mkdir(dir.c_str(), 0755);
  const std::string path = dir + "/python3";
  { std::ofstream(path) << "#!/bin/sh\necho \"" << name << " ran: $*\"\n"; }
  ::chmod(path.c_str(), 0755);
  return path;
}

// A .py runs with the python3 a shell would run: the first on PATH (an activated virtual
// environment's), not a system interpreter without the user's torch; DDPRUN_PYTHON overrides.
TEST_F(DdprunEnv, PythonScriptRunsWithTheFirstPython3OnPath) {
  const std::string script = dir() + "/train.py";
  { std::ofstream(script) << "print('never run by a real python here')\n"; }
  fake_python(dir() + "/venv-bin", "venv-python");
  const std::string other = fake_python(dir() + "/other-bin", "chosen-python");
  const char* path = std::getenv("PATH");
  const std::string venv_path = dir() + "/venv-bin:" + (path ? path : "/usr/bin:/bin");

  RunResult r = run({"--nproc-per-node", "1", script, "--lr", "3"}, {{"PATH", venv_path}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("venv-python ran: -u " + script + " --lr 3"), std::string::npos) << r.out;

  r = run({"--nproc-per-node", "1", script}, {{"PATH", venv_path}, {"DDPRUN_PYTHON", other}});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("chosen-python ran: -u " + script), std::string::npos) << r.out;

  r = run({"--nproc-per-node", "1", script}, {{"PATH", dir() + "/nothing-here"}});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no python3 on PATH to run " + script), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("DDPRUN_PYTHON"), std::string::npos) << r.err;
}

TEST_F(DdprunEnv, PythonModuleRunsUnderPython) {
  RunResult r = run({"-m", "json.tool", "--help"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("json.tool"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace ddp::launcher::testing
