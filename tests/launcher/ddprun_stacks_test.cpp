// End-to-end tests of `ddprun stacks`, the stacks in ddprun's failure report, and the
// --hang-timeout watchdog on PyTorch's gloo backend, with real ddprun agents and workers.
// Tests needing a tool this machine lacks (eu-stack, py-spy, torch) are skipped with the reason.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <regex>
#include <string>
#include <thread>

#include "../support/free_port_range.hpp"
#include "launcher_fixture.hpp"

namespace ddp::launcher::testing {
namespace {

using Clock = std::chrono::steady_clock;

std::string python() {
  return DDP_TEST_PYTHON;
}

bool python_has_torch() {
  return !python().empty() &&
         ::system((python() + " -c 'import torch.distributed' >/dev/null 2>&1").c_str()) == 0;
}

std::string python_dir() {
  return python().substr(0, python().rfind('/'));
}

bool have(const std::string& program) {
  return ::system(("command -v " + program + " >/dev/null 2>&1").c_str()) == 0;
}

std::string hang_worker() {
  return std::string(DDP_LAUNCHER_WORKERS_DIR) + "/hang_worker.py";
}

// The line of hang_worker.py marked "HANG LINE".
int hang_line() {
  std::ifstream in(hang_worker());
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.find("HANG LINE") != std::string::npos) return n;
  }
  return -1;
}

// Runs a command, returning its exit status and stdout+stderr.
std::pair<int, std::string> capture(const std::string& command) {
  std::string out;
  FILE* p = ::popen((command + " 2>&1").c_str(), "r");
  if (p == nullptr) return {-1, ""};
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  const int status = ::pclose(p);
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, out};
}

class DdprunStacks : public LauncherTest {
 protected:
  std::string runtime_dir() const { return dir() + "/rt"; }
  EnvPairs env() const {
    const char* path = std::getenv("PATH");
    return {{"DDPRUN_RUNTIME_DIR", runtime_dir()},
            {"PATH", python_dir() + ":" + (path ? path : "/usr/bin:/bin")}};
  }
  // `ddprun stacks` with this test's registry, polled (bounded) until its output holds every
  // one of `expected` (the workers may not have reached their place yet).
  std::pair<int, std::string> stacks_until(const std::string& run_id,
                                           const std::vector<std::string>& expected,
                                           const std::string& extra = "") {
    const std::string command = "DDPRUN_RUNTIME_DIR=" + runtime_dir() + " PATH=" + python_dir() +
                                ":$PATH " + ddprun() + " stacks --run-id " + run_id +
                                " --timeout 10 " + extra;
    std::pair<int, std::string> r;
    const auto until = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < until) {
      r = capture(command);
      bool all = true;
      for (const auto& e : expected) all = all && r.second.find(e) != std::string::npos;
      if (all) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
    return r;
  }
  void stop(pid_t pid) {
    ::kill(pid, SIGTERM);
    wait(pid, 60);
  }
  // Starts two agents of one c10d job on loopback (two "nodes"), each with two C++ workers
  // that sleep, and waits (bounded) until both finished their rendezvous; empty (a test
  // failure showing both agents' stderr) when they do not within 60 s. Another test may bind
  // the endpoint port between the probe here and the first agent's bind: both agents then
  // join that stranger's server as clients and never rendezvous, so they are stopped and
  // started again on another port. (A CI run once failed here after 60 s of `ddprun stacks`
  // finding no agent, with nothing to say why: hence the stderr.)
  // `extra`: more ddprun flags and the worker command (default: C++ workers sleeping 120 s).
  std::vector<pid_t> start_two_nodes(const std::string& run_id, const EnvPairs& e,
                                     std::vector<std::string> extra = {}) {
    if (extra.empty()) extra = {"--no-python", worker(), "sleep", "120"};
    const std::string stranger = "already served on this machine";
    const std::string joined = "rendezvous round 0 of run '" + run_id + "'";
    for (int attempt = 0; attempt < 3; ++attempt) {
      const std::string endpoint =
          "127.0.0.1:" + std::to_string(ddp::test::free_ports_below_ephemeral_range());
      std::vector<pid_t> agents;
      std::vector<std::string> errs;
      for (int n = 0; n < 2; ++n) {
        std::vector<std::string> args = {"--nnodes",       "2",    "--nproc-per-node", "2",
                                         "--rdzv-backend", "c10d", "--rdzv-endpoint",  endpoint,
                                         "--run-id",       run_id};
        args.insert(args.end(), extra.begin(), extra.end());
        agents.push_back(start(args, e));
        errs.push_back(current_err_path());
      }
      auto both_have = [&](const std::string& text) {
        return read_file(errs[0]).find(text) != std::string::npos &&
               read_file(errs[1]).find(text) != std::string::npos;
      };
      const auto until = Clock::now() + std::chrono::seconds(60);
      while (Clock::now() < until && !both_have(joined)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      if (both_have(joined)) return agents;
      const bool port_taken = both_have(stranger);
      const std::string why =
          "agent 0's stderr:\n" + read_file(errs[0]) + "\nagent 1's stderr:\n" + read_file(errs[1]);
      for (pid_t a : agents) stop(a);
      if (!port_taken) {
        ADD_FAILURE() << "the agents of run '" << run_id << "' did not rendezvous in 60 s;\n"
                      << why;
        return {};
      }
    }
    ADD_FAILURE() << "another program took the rendezvous port three times";
    return {};
  }
};

TEST_F(DdprunStacks, NoRunningJobIsAClearError) {
  auto [code, out] = capture("DDPRUN_RUNTIME_DIR=" + runtime_dir() + " " + ddprun() +
                             " stacks --run-id nosuchjob --timeout 2");
  EXPECT_EQ(code, 2) << out;
  EXPECT_NE(out.find("no running ddprun agent of run 'nosuchjob' on this host"), std::string::npos)
      << out;
  auto [code2, out2] = capture(ddprun() + " stacks");
  EXPECT_EQ(code2, 2) << out2;
  EXPECT_NE(out2.find("pass --run-id ID"), std::string::npos) << out2;
}

// Two agents of one c10d job on loopback (two "nodes"), C++ workers, an authenticated store:
// `ddprun stacks` on one reaches the other through the job's store, and the four identical
// stacks fold into one.
TEST_F(DdprunStacks, NativeStacksOfTwoAgentsFold) {
  if (!have("eu-stack")) GTEST_SKIP() << "no eu-stack (apt-get install elfutils)";
  EnvPairs e = env();
  e.push_back({"DDP_STORE_TOKEN", "stacks-test-token"});
  const std::vector<pid_t> agents = start_two_nodes("cxxstacks", e);
  ASSERT_EQ(agents.size(), 2u);
  EXPECT_EQ(read_file(current_err_path()).find("have no token"), std::string::npos)
      << read_file(current_err_path());
  auto [code, out] = stacks_until("cxxstacks", {"ranks 0-3 (4 of 4)", "sleep_for"});
  EXPECT_EQ(code, 0) << out;
  EXPECT_NE(out.find("4 ranks from 2 of 2 nodes"), std::string::npos) << out;
  EXPECT_NE(out.find("ranks 0-3 (4 of 4), eu-stack"), std::string::npos) << out;
  EXPECT_NE(out.find("sleep_for"), std::string::npos) << out;
  for (pid_t a : agents) stop(a);
  expect_no_survivors();
}

// The same job without a store token: the other node does not serve stack requests (anyone
// reaching the store's port could make it ptrace its workers), and `ddprun stacks` counts both
// nodes, answers for its own and says what the other needs.
TEST_F(DdprunStacks, WithoutAStoreTokenOtherNodesAreNotAsked) {
  if (!have("eu-stack")) GTEST_SKIP() << "no eu-stack (apt-get install elfutils)";
  const std::vector<pid_t> agents = start_two_nodes("notoken", env());
  ASSERT_EQ(agents.size(), 2u);
  // Each agent warned that the job runs without a token (issue 49, finding 8).
  EXPECT_NE(read_file(current_err_path())
                .find("warning: this multi-node job's stores have no token: anyone who can reach "
                      "127.0.0.1:"),
            std::string::npos)
      << read_file(current_err_path());
  auto [code, out] = stacks_until("notoken", {"2 ranks from 1 of 2 nodes", "sleep_for"});
  EXPECT_EQ(code, 1) << out;
  EXPECT_NE(out.find("2 ranks from 1 of 2 nodes"), std::string::npos) << out;
  EXPECT_NE(out.find("the job's store has no auth token"), std::string::npos) << out;
  for (pid_t a : agents) stop(a);
  expect_no_survivors();
}

// Python workers on gloo: rank 1's odd stack comes first, with its own function and line.
TEST_F(DdprunStacks, PythonStacksNameTheOddRankFirst) {
  if (!python_has_torch()) GTEST_SKIP() << "'" << python() << "' cannot import torch";
  if (!have(python_dir() + "/py-spy") && !have("py-spy")) GTEST_SKIP() << "no py-spy";
  const pid_t agent = start(
      {"--standalone", "--nproc-per-node", "3", "--run-id", "pystacks", hang_worker()}, env());
  auto [code, out] =
      stacks_until("pystacks", {"ranks 0,2 (2 of 3)", "rank 1 (1 of 3)", "wait_forever at",
                                "all_reduce called from hang_worker.py:"});
  EXPECT_EQ(code, 0) << out;
  const std::string odd = "rank 1 (1 of 3), py-spy on";
  const size_t odd_at = out.find(odd);
  ASSERT_NE(odd_at, std::string::npos) << out;
  EXPECT_LT(odd_at, out.find("ranks 0,2 (2 of 3)")) << out;
  EXPECT_NE(out.find("wait_forever at hang_worker.py:" + std::to_string(hang_line())),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("all_reduce called from hang_worker.py:"), std::string::npos) << out;
  stop(agent);
  expect_no_survivors();
}

// The issue's test: PyTorch's gloo, 3 ranks, rank 1 sleeps in its own function before an
// all_reduce. --hang-timeout 15 ends the job long before gloo's 30-minute timeout, and the
// report names rank 1 and the line of that function. (The bound only catches a hang.)
TEST_F(DdprunStacks, HangTimeoutEndsAGlooJobAndNamesTheLine) {
  if (!python_has_torch()) GTEST_SKIP() << "'" << python() << "' cannot import torch";
  const auto started = Clock::now();
  RunResult r = run({"--standalone", "--nproc-per-node", "3", "--hang-timeout", "15", "--log-dir",
                     dir() + "/logs", "--run-id", "hang", hang_worker()},
                    env(), 120);
  const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
  std::printf("ddprun ended the hung job after %.1f s\n", seconds);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("hang: no collective completed for"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 is in no collective"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank:       1 (local rank 1)"), std::string::npos) << r.err;
  const std::string where =
      "rank 1 was in wait_forever at hang_worker.py:" + std::to_string(hang_line());
  EXPECT_NE(r.err.find(where), std::string::npos) << r.err;
  // PyTorch's own recorder, read through ddprun's hook, in the hang report.
  EXPECT_NE(r.err.find("hang report: rank 1 is behind"), std::string::npos) << r.err;
  EXPECT_TRUE(file_exists(dir() + "/logs/hang/attempt_0/stacks." + [] {
    char h[256] = {};
    ::gethostname(h, sizeof(h) - 1);
    return std::string(h);
  }() + ".txt"));
  expect_no_survivors();
}

// The same for C++ workers on ddp's own process groups, with no Python hook: ddp's recorder
// writes the progress records (src/comm/progress_report.hpp). Before it, the watchdog saw no
// record, never fired, and the job hung until the test's limit.
TEST_F(DdprunStacks, HangTimeoutEndsACppJobOnDdpGroupsAndNamesTheRank) {
  for (const std::string backend : {"cpu", "gloo"}) {
    SCOPED_TRACE(backend);
    const auto started = Clock::now();
    RunResult r = run({"--standalone", "--nproc-per-node", "3", "--hang-timeout", "10", "--log-dir",
                       dir() + "/logs-" + backend, "--run-id", "cpphang-" + backend, "--no-python",
                       DDP_COLLECTIVE_HANG_WORKER, "1", backend},
                      env(), 120);
    const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
    std::printf("%s: ddprun ended the hung job after %.1f s\n", backend.c_str(), seconds);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_NE(r.err.find("hang: no collective completed for"), std::string::npos) << r.err;
    EXPECT_TRUE(std::regex_search(r.err, std::regex("ranks 0,2 wait in " + backend +
                                                    ":all_reduce #6 since [0-9.]+ s; rank 1 is "
                                                    "in no collective \\(5 completed\\)")))
        << r.err;
    EXPECT_NE(r.err.find("rank:       1 (local rank 1)"), std::string::npos) << r.err;
    if (have("eu-stack")) {
      EXPECT_NE(r.err.find("rank 1 was in"), std::string::npos) << r.err;
      EXPECT_NE(r.err.find("wait_forever"), std::string::npos) << r.err;
    }
    expect_no_survivors();
  }
}

// Two nodes: rank 3 hangs outside collectives on the node of ranks 2-3. The node of ranks 0-1
// sees only waiting ranks: it holds its verdict (when its watchdog fires first), and the job ends
// with the other node's, which names rank 3. Before, both fired at once and the first node named
// its own rank 0 as the root cause. Which watchdog fires first depends on the machine's load, so
// each node is told apart by its ranks, not by whether it printed the hold.
TEST_F(DdprunStacks, HangTimeoutOnTwoNodesNamesTheRankBehindOnEveryNode) {
  const std::vector<pid_t> agents = start_two_nodes(
      "cpphang2", env(),
      {"--hang-timeout", "8", "--no-python", DDP_COLLECTIVE_HANG_WORKER, "3", "cpu"});
  ASSERT_EQ(agents.size(), 2u);
  std::vector<RunResult> results;
  for (pid_t a : agents) results.push_back(wait(a, 120));
  int waiting_node = 0, culprit_node = 0;
  for (const RunResult& r : results) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    // Round 0's line: the agents re-form a round 1 after the stop, where the nodes may swap.
    const size_t round0 = r.err.find("rendezvous round 0 of run 'cpphang2'");
    ASSERT_NE(round0, std::string::npos) << r.err;
    const std::string round0_line = r.err.substr(round0, r.err.find('\n', round0) - round0);
    if (round0_line.find("this is node 0 (ranks 0-1)") != std::string::npos) {
      ++waiting_node;
      // Stopped by the other node, with its verdict; never its own waiting rank as the cause.
      EXPECT_NE(r.err.find("rank 3 is in no collective (5 completed)"), std::string::npos) << r.err;
      EXPECT_EQ(r.err.find("cause:      stopped by ddprun's hang watchdog"), std::string::npos)
          << r.err;
      EXPECT_FALSE(std::regex_search(r.err, std::regex("hang: [^\n]*; stopping the workers")))
          << r.err;
    } else {
      ++culprit_node;
      EXPECT_NE(round0_line.find("this is node 1 (ranks 2-3)"), std::string::npos) << r.err;
      EXPECT_NE(r.err.find("rank 3 is in no collective (5 completed)"), std::string::npos) << r.err;
      EXPECT_NE(r.err.find("rank:       3 (local rank 1)"), std::string::npos) << r.err;
    }
  }
  EXPECT_EQ(waiting_node, 1);
  EXPECT_EQ(culprit_node, 1);
  expect_no_survivors();
}

// Two nodes: rank 3 exits with code 7 while the others are in an all_reduce with it. The node
// of ranks 0-1 sees its own workers fail too (their all_reduce loses its peer), but the node of
// rank 3 ends the round as soon as it sees the exit: the first node reports rank 3's failure
// as the cause, not its own workers'. (Before, it named its rank 0, "failed: signal 6", when
// that crash won the race against the round's end; the deterministic check of that rule is
// AgentRestartCount.AFailureAfterAnotherNodeEndedTheRoundIsNotThisNodesOwn.)
TEST_F(DdprunStacks, AFailureOnOneNodeIsTheCauseOnEveryNode) {
  const std::vector<pid_t> agents = start_two_nodes(
      "cppexit2", env(), {"--no-python", DDP_COLLECTIVE_HANG_WORKER, "3", "cpu", "exit"});
  ASSERT_EQ(agents.size(), 2u);
  std::vector<RunResult> results;
  for (pid_t a : agents) results.push_back(wait(a, 120));
  for (const RunResult& r : results) {
    EXPECT_EQ(r.exit_code, 1) << r.err;
    // The node of ranks 0-1 in round 0 (its first round line): rank 3's exit is its cause.
    if (r.err.find("(ranks 0-1)") < r.err.find("(ranks 2-3)")) {
      EXPECT_TRUE(std::regex_search(r.err, std::regex("membership changed \\(rank 3 \\(local rank "
                                                      "1, pid [0-9]+\\) failed: exit code 7")))
          << r.err;
      EXPECT_EQ(r.err.find("Root cause (first failure):\n  rank:       0"), std::string::npos)
          << r.err;
      EXPECT_EQ(r.err.find("Root cause (first failure):\n  rank:       1"), std::string::npos)
          << r.err;
    } else {
      EXPECT_NE(r.err.find("Root cause (first failure):\n  rank:       3 (local rank 1)"),
                std::string::npos)
          << r.err;
    }
  }
  expect_no_survivors();
}

// A failed C++ worker: the report says where the others were.
TEST_F(DdprunStacks, FailureReportShowsTheOthersStacks) {
  if (!have("eu-stack")) GTEST_SKIP() << "no eu-stack (apt-get install elfutils)";
  const std::string ready = dir() + "/ready";
  ::mkdir(ready.c_str(), 0755);
  RunResult r =
      run({"--nproc-per-node", "3", "--run-id", "failstacks", "--no-python", worker(), "ready",
           ready, "await-peers", ready, "fail-if-rank", "1", "3", "1", "sleep", "60"},
          {{"DDPRUN_RUNTIME_DIR", runtime_dir()}, {"DDPRUN_TERM_GRACE_S", "5"}}, 90);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  // Both others are named in their sleep. Usually their stacks fold into one ("ranks 0,2 were
  // in ..."); eu-stack sometimes misses the sleep_for frame of one of them, and then each has
  // its own summary.
  EXPECT_TRUE(std::regex_search(r.err, std::regex("failed: exit code 3; (ranks 0,2 were in "
                                                  "clock_nanosleep|rank 0 was in clock_nanosleep"
                                                  "[^;\\n]*; rank 2 was in clock_nanosleep)")))
      << r.err;
  EXPECT_NE(r.err.find("Where the running workers were when ddprun stopped them:"),
            std::string::npos)
      << r.err;
  expect_no_survivors();
}

// Issue 49, finding 11: the stack tools run as children of ddprun's stack tracer, a process
// outside the agent's tree that the workers declare as their tracer, not of the agent (whose
// descendants, every worker included, could then trace every worker). A fake eu-stack writes
// its parent's command line; the failure report runs it for the two running ranks.
TEST_F(DdprunStacks, TheStackToolsRunAsChildrenOfTheStackTracer) {
  const std::string tool = dir() + "/eu-stack";
  const std::string parents = dir() + "/parents";
  {
    std::ofstream out(tool);
    out << "#!/bin/sh\n"
        // One write per line: the two tools run at once.
        << "line=$(tr '\\0' ' ' </proc/$PPID/cmdline); echo \"$line\" >>" << parents << "\n"
        << "echo \"PID $2 - process\"; echo \"TID $2:\"; echo \"#0  0x0 wait_here\"\n";
  }
  ::chmod(tool.c_str(), 0755);
  const std::string ready = dir() + "/ready";
  ::mkdir(ready.c_str(), 0755);
  RunResult r =
      run({"--nproc-per-node", "3", "--run-id", "tracer", "--no-python", worker(), "ready", ready,
           "await-peers", ready, "fail-if-rank", "1", "3", "1", "sleep", "60"},
          {{"DDPRUN_RUNTIME_DIR", runtime_dir()}, {"DDPRUN_EU_STACK", tool}}, 90);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("wait_here"), std::string::npos) << r.err;
  const auto lines = lines_with(read_file(parents), "ddprun");
  ASSERT_EQ(lines.size(), 2u) << read_file(parents) << r.err;
  for (const auto& line : lines) {
    EXPECT_NE(line.find(" __stack-tracer "), std::string::npos)
        << "a stack tool's parent was not the stack tracer: " << line;
  }
  expect_no_survivors();
}

}  // namespace
}  // namespace ddp::launcher::testing
