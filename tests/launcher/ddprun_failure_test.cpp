// ddprun end to end: gang kill and restarts, the root-cause report, signal forwarding, and
// that no process survives any exit path.
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "../support/free_port_range.hpp"
#include "ddp/util/socket.hpp"
#include "launcher_fixture.hpp"

namespace ddp::launcher::testing {
namespace {

using DdprunFailure = LauncherTest;

// ddprun's arguments for `nproc` workers under --recovery step on master port `port` (ddprun
// then hosts the job's store there: give each test a claimed port, 29500 may be another
// test's), then `command` (the worker and its steps).
std::vector<std::string> under_recovery_step(const std::string& port, int nproc, int max_restarts,
                                             const std::vector<std::string>& command) {
  std::vector<std::string> args = {
      "--nproc-per-node", std::to_string(nproc),       "--master-port", port, "--recovery", "step",
      "--max-restarts",   std::to_string(max_restarts)};
  args.insert(args.end(), command.begin(), command.end());
  return args;
}

std::string claimed_port() {
  return std::to_string(ddp::test::free_ports_below_ephemeral_range());
}

int count(const std::string& text, const std::string& needle) {
  return static_cast<int>(lines_with(text, needle).size());
}

// Names in a directory, without "." and "..".
std::vector<std::string> entries(const std::string& path) {
  std::vector<std::string> out;
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d)) {
      std::string name = e->d_name;
      if (name != "." && name != "..") out.push_back(name);
    }
    ::closedir(d);
  }
  return out;
}

TEST_F(DdprunFailure, FailureKillsTheGroupAndRestartsIt) {
  // Rank 1 fails in attempts 0 and 1, where rank 0 would sleep for a minute unless stopped;
  // in attempt 2 both succeed at once.
  RunResult r = run({"--nproc-per-node", "2", "--max-restarts", "3", worker(), "env",
                     "record-signals", dir(), "ready", dir(), "await-peers", dir(), "fail-if-rank",
                     "1", "3", "2", "sleep-if-restart-below", "2", "60"},
                    {}, 90);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::string rc = "TORCHELASTIC_RESTART_COUNT=" + std::to_string(attempt) + " ";
    EXPECT_EQ(count(r.out, rc), 2) << r.out;
  }
  EXPECT_EQ(count(r.out, "TORCHELASTIC_RESTART_COUNT=3 "), 0) << r.out;
  // Rank 0 was stopped with SIGTERM in the two failed attempts, not in the last one.
  EXPECT_TRUE(file_exists(dir() + "/0.0.SIGTERM"));
  EXPECT_TRUE(file_exists(dir() + "/0.1.SIGTERM"));
  EXPECT_FALSE(file_exists(dir() + "/0.2.SIGTERM"));
  EXPECT_NE(r.err.find("restarting the worker group (restart 1 of 3)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("restarting the worker group (restart 2 of 3)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 1 (local rank 1"), std::string::npos) << r.err;
}

// Issue 48: a program that is not recovery-aware under --recovery step (no worker announced a
// StepManager in the job's store) gets its whole group restarted, with the reason, as
// --recovery group would: restarting rank 1 alone left ranks 0 and 2 waiting in their
// collective (here: a sleep of 60 s) for ever.
TEST_F(DdprunFailure, RecoveryStepWithoutAStepManagerRestartsTheWholeGroup) {
  RunResult r =
      run(under_recovery_step(claimed_port(), 3, 1,
                              {worker(), "env", "ready", dir(), "await-peers", dir(),
                               "fail-if-rank", "1", "3", "1", "sleep-if-restart-below", "1", "60"}),
          {}, 90);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.out, "TORCHELASTIC_RESTART_COUNT=0 "), 3) << r.out;
  EXPECT_EQ(count(r.out, "TORCHELASTIC_RESTART_COUNT=1 "), 3) << r.out;  // all three again
  EXPECT_NE(r.err.find("no worker runs its training loop under a StepManager"), std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("restarting the whole group instead of rank 1 alone"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("restarting only rank 1"), std::string::npos) << r.err;
}

// Rank 0 finishes before rank 1 fails: no peer runs that could heal a replacement, and none
// runs a StepManager, so the whole group restarts as with --recovery group (it used to end the
// job: the StepManager check was skipped once a peer had exited).
TEST_F(DdprunFailure, RecoveryStepWithoutAStepManagerRestartsTheGroupAfterAPeerFinished) {
  RunResult r =
      run(under_recovery_step(claimed_port(), 2, 1,
                              {worker(), "env", "ready", dir(), "await-peers", dir(),
                               "await-exit-of-rank", "0", dir(), "fail-if-rank", "1", "3", "1"}),
          {}, 90);
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.out, "TORCHELASTIC_RESTART_COUNT=0 "), 2) << r.out;
  EXPECT_EQ(count(r.out, "TORCHELASTIC_RESTART_COUNT=1 "), 2) << r.out;  // both again
  EXPECT_NE(r.err.find("restarting the whole group instead of rank 1 alone"), std::string::npos)
      << r.err;
}

// A worker whose torch.distributed tried to serve its own store on MASTER_PORT (ddp not
// importable: torch's env:// rendezvous) fails with PyTorch's EADDRINUSE: ddprun says why.
TEST_F(DdprunFailure, RecoveryStepNamesAWorkerThatTriedToServeTheJobStore) {
  const std::string port = claimed_port();
  const std::string torch_error =
      "torch.distributed.DistNetworkError: The server socket has failed to listen on any local "
      "network address. port: " +
      port + ", useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use";
  RunResult r =
      run(under_recovery_step(port, 1, 0, {worker(), "eprint", torch_error, "exit", "1"}), {}, 90);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("ddprun: rank 0 could not serve torch.distributed's store on port " + port +
                       " (EADDRINUSE): under --recovery step ddprun serves the job's store"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("its Python cannot import ddp"), std::string::npos) << r.err;
}

TEST_F(DdprunFailure, ExhaustedRestartsReportTheRootCause) {
  RunResult r = run({"--nproc-per-node", "2", "--max-restarts", "1", worker(), "stderr-lines", "50",
                     "error-file-if-rank", "1", "ValueError: bad batch 17", "fail-if-rank", "1",
                     "3", "99", "sleep", "60"},
                    {}, 90);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("1 of 1 restarts used"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank:       1 (local rank 1)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exit:       exit code 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("message:    ValueError: bad batch 17"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("Traceback: test_worker"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("host:"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("time:"), std::string::npos) << r.err;
  // The last 40 stderr lines of rank 1, not earlier ones.
  EXPECT_NE(r.err.find("stderr (last 40 lines)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("    stderr line 49\n"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("    stderr line 10\n"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("    stderr line 9\n"), std::string::npos) << r.err;
  // Rank 0 was stopped by ddprun, not a cause.
  EXPECT_NE(r.err.find("Stopped by ddprun after the root cause:\n  rank 0"), std::string::npos)
      << r.err;
}

TEST_F(DdprunFailure, DeathBySignalIsNamed) {
  RunResult r = run({"--nproc-per-node", "2", worker(), "crash-if-rank", "0",
                     std::to_string(SIGSEGV), "sleep", "60"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("exit:       signal 11 (SIGSEGV)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank:       0 (local rank 0)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("<none written>"), std::string::npos) << r.err;
}

TEST_F(DdprunFailure, WorkerIgnoringSigtermIsKilledAfterTheGrace) {
  RunResult r = run({"--nproc-per-node", "2", worker(), "ignore-term", "ready", dir(),
                     "await-peers", dir(), "fail-if-rank", "1", "4", "1", "sleep", "60"},
                    {{"DDPRUN_TERM_GRACE_S", "0.3"}});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("sending SIGKILL"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank 0 (local rank 0, pid"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("signal 9 (SIGKILL)"), std::string::npos) << r.err;
}

TEST_F(DdprunFailure, WorkerInUninterruptibleSleepIsNamed) {
  // A vfork parent waits for its child in state D (a killable wait, so SIGKILL still ends it):
  // a real D-state worker without a hung NFS mount. Rank 1 sits there ignoring SIGTERM while
  // rank 0 fails.
  RunResult r = run({"--nproc-per-node", "2", worker(), "ignore-term", "ready", dir(),
                     "await-peers", dir(), "vfork-sleep-if-rank", "1", "30", "sleep", "0.3",
                     "fail-if-rank", "0", "3", "1", "sleep", "30"},
                    {{"DDPRUN_TERM_GRACE_S", "0.3"}});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const int pid = std::stoi(read_file(dir() + "/ready.1.0"));
  const std::string line =
      "rank 1 (pid " + std::to_string(pid) + ") is in uninterruptible sleep (D state";
  // Named when rank 0 fails, and again when SIGTERM's grace runs out.
  EXPECT_EQ(lines_with(r.err, line).size(), 2u) << r.err;
  EXPECT_NE(r.err.find("until the kernel call returns (often a hung NFS or device)"),
            std::string::npos)
      << r.err;
  expect_no_survivors();
}

TEST_F(DdprunFailure, SignalsAreForwardedAndSigtermStopsTheRun) {
  pid_t ddprun = start(
      {"--nproc-per-node", "2", worker(), "record-signals", dir(), "ready", dir(), "sleep", "60"});
  ASSERT_TRUE(wait_for_file(dir() + "/ready.0.0"));
  ASSERT_TRUE(wait_for_file(dir() + "/ready.1.0"));

  ::kill(ddprun, SIGUSR1);
  EXPECT_TRUE(wait_for_file(dir() + "/0.0.SIGUSR1"));
  EXPECT_TRUE(wait_for_file(dir() + "/1.0.SIGUSR1"));
  ::kill(ddprun, SIGUSR2);
  EXPECT_TRUE(wait_for_file(dir() + "/0.0.SIGUSR2"));
  EXPECT_TRUE(wait_for_file(dir() + "/1.0.SIGUSR2"));
  EXPECT_TRUE(still_running(ddprun)) << "SIGUSR1/SIGUSR2 must not stop ddprun";

  ::kill(ddprun, SIGTERM);
  RunResult r = wait(ddprun);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_TRUE(file_exists(dir() + "/0.0.SIGTERM"));
  EXPECT_TRUE(file_exists(dir() + "/1.0.SIGTERM"));
  EXPECT_NE(r.err.find("received SIGTERM"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("restarting"), std::string::npos) << r.err;
}

TEST_F(DdprunFailure, SigintIsForwardedAndNotRestarted) {
  pid_t ddprun = start({"--nproc-per-node", "2", "--max-restarts", "5", worker(), "record-signals",
                        dir(), "ready", dir(), "sleep", "60"});
  ASSERT_TRUE(wait_for_file(dir() + "/ready.0.0"));
  ASSERT_TRUE(wait_for_file(dir() + "/ready.1.0"));
  ::kill(ddprun, SIGINT);
  RunResult r = wait(ddprun);
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  EXPECT_TRUE(file_exists(dir() + "/0.0.SIGINT"));
  EXPECT_TRUE(file_exists(dir() + "/1.0.SIGINT"));
  EXPECT_FALSE(file_exists(dir() + "/ready.0.1")) << "an interrupted run must not restart";
}

TEST_F(DdprunFailure, SigintDuringTheRendezvousWaitExitsAndRemovesTheTemporaryDirectory) {
  // One node of two: it hosts the store and waits for a peer that never comes.
  const std::string tmp = dir() + "/tmp";
  ASSERT_EQ(::mkdir(tmp.c_str(), 0700), 0);
  const int port = ddp::test::free_ports_below_ephemeral_range();
  pid_t ddprun =
      start({"--nnodes", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint",
             "127.0.0.1:" + std::to_string(port), "--rdzv-id", "lonely", worker(), "env"},
            {{"TMPDIR", tmp}});
  // The temporary run directory is made just before the wait starts.
  for (int i = 0; i < 6000 && entries(tmp).empty(); ++i) ::usleep(5000);
  ASSERT_EQ(entries(tmp).size(), 1u) << current_err();
  ::kill(ddprun, SIGINT);
  RunResult r = wait(ddprun, 30);
  EXPECT_EQ(r.exit_code, 128 + SIGINT) << r.err;
  EXPECT_NE(r.err.find("received SIGINT while waiting for the rendezvous"), std::string::npos)
      << r.err;
  EXPECT_TRUE(entries(tmp).empty()) << "left behind: " << entries(tmp).front();
}

TEST_F(DdprunFailure, SecondSigtermKillsAtOnce) {
  // Workers ignore SIGTERM and the grace period is long: only the second signal ends the run
  // before the test's own bounded wait gives up.
  pid_t ddprun =
      start({"--nproc-per-node", "2", worker(), "ignore-term", "ready", dir(), "sleep", "60"},
            {{"DDPRUN_TERM_GRACE_S", "300"}});
  ASSERT_TRUE(wait_for_file(dir() + "/ready.0.0"));
  ASSERT_TRUE(wait_for_file(dir() + "/ready.1.0"));
  ::kill(ddprun, SIGTERM);
  // A second standard signal sent before the first is read would merge with it.
  for (int i = 0; i < 6000 && current_err().find("received SIGTERM;") == std::string::npos; ++i) {
    ::usleep(5000);
  }
  ASSERT_NE(current_err().find("received SIGTERM;"), std::string::npos) << current_err();
  ::kill(ddprun, SIGTERM);
  RunResult r = wait(ddprun, 30);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_NE(r.err.find("received SIGTERM again; killing the workers now"), std::string::npos)
      << r.err;
}

TEST_F(DdprunFailure, NoSurvivorsAfterAWorkerIsSigkilled) {
  // Every worker leaves a grandchild that escaped its process group and ignores SIGTERM.
  pid_t ddprun =
      start({"--nproc-per-node", "2", worker(), "grandchild", "ready", dir(), "sleep", "60"},
            {{"DDPRUN_TERM_GRACE_S", "0.3"}});
  ASSERT_TRUE(wait_for_file(dir() + "/ready.1.0"));
  ASSERT_TRUE(wait_for_file(dir() + "/ready.0.0"));
  int victim = std::stoi(read_file(dir() + "/ready.1.0"));
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  RunResult r = wait(ddprun);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("exit:       signal 9 (SIGKILL)"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("rank:       1 (local rank 1)"), std::string::npos) << r.err;
  // Not the out-of-memory killer, and the report says so with the worker's peak memory.
  EXPECT_NE(r.err.find("cause:      killed by SIGKILL from outside"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("its peak resident memory was "), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("out-of-memory killer ("), std::string::npos) << r.err;
  expect_no_survivors();
}

TEST_F(DdprunFailure, NoSurvivorsAfterDdprunIsTerminated) {
  pid_t ddprun =
      start({"--nproc-per-node", "2", worker(), "grandchild", "ready", dir(), "sleep", "60"},
            {{"DDPRUN_TERM_GRACE_S", "0.3"}});
  ASSERT_TRUE(wait_for_file(dir() + "/ready.0.0"));
  ASSERT_TRUE(wait_for_file(dir() + "/ready.1.0"));
  ::kill(ddprun, SIGTERM);
  RunResult r = wait(ddprun);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  expect_no_survivors();
}

TEST_F(DdprunFailure, NoSurvivorsAfterANormalExit) {
  // Workers succeed but leave stubborn grandchildren behind: ddprun stops those too.
  RunResult r = run({"--nproc-per-node", "2", worker(), "grandchild", "print", "done"},
                    {{"DDPRUN_TERM_GRACE_S", "0.3"}});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(count(r.out, "done"), 2) << r.out;
  expect_no_survivors();
}

TEST_F(DdprunFailure, SigkilledDdprunTakesItsWorkersAlong) {
  pid_t ddprun = start({"--nproc-per-node", "2", worker(), "ready", dir(), "sleep", "60"});
  ASSERT_TRUE(wait_for_file(dir() + "/ready.0.0"));
  ASSERT_TRUE(wait_for_file(dir() + "/ready.1.0"));
  ::kill(ddprun, SIGKILL);
  RunResult r = wait(ddprun);
  EXPECT_EQ(r.signal, SIGKILL);
  // PR_SET_PDEATHSIG kills the workers; they are reparented here (subreaper) and reaped.
  expect_no_survivors();
}

}  // namespace
}  // namespace ddp::launcher::testing
