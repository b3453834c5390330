// ddprun and preemption: --signals-to-handle (which signals are caught and forwarded, the
// others keeping their default action), --shutdown-timeout, and the workers' requeue status
// (util/exit_status.hpp: awaited, never restarted, passed on as ddprun's exit status).
#include <signal.h>

#include "ddp/util/exit_status.hpp"
#include "launcher_fixture.hpp"

namespace ddp::launcher::testing {
namespace {

class DdprunRequeue : public LauncherTest {};

TEST_F(DdprunRequeue, WorkersAskingForARequeueAreAwaitedAndNotRestarted) {
  // Rank 0 exits with the status at once; rank 1 only after a while: it must not be stopped.
  RunResult r = run({"--nproc-per-node", "2", "--max-restarts", "3", worker(), "ready", dir(),
                     "await-peers", dir(), "fail-if-rank", "0", "75", "100", "sleep", "0.5",
                     "print", "rank 1 finished its checkpoint", "exit", "75"});
  EXPECT_EQ(r.exit_code, kRequeueExitStatus) << r.err;
  EXPECT_NE(r.out.find("rank 1 finished its checkpoint"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("exited with 75: it stopped on request and asks to be started again"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.err.find("exiting with 75 (requeue)"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("restarting"), std::string::npos) << r.err;
  EXPECT_FALSE(file_exists(dir() + "/ready.0.1")) << "the group was restarted";
  expect_no_survivors();
}

TEST_F(DdprunRequeue, SigtermWhileWorkersCheckpointEndsWithTheirRequeueStatus) {
  // Workers that answer SIGTERM by "checkpointing" and exiting with the requeue status.
  const std::string script =
      "trap 'exit 75' TERM; touch \"$0/ready.$RANK\"; "
      "while :; do sleep 0.05; done";
  pid_t ddprun = start({"--nproc-per-node", "2", "--no-python", "/bin/sh", "-c", script, dir()});
  ASSERT_TRUE(wait_for_file(dir() + "/ready.0"));
  ASSERT_TRUE(wait_for_file(dir() + "/ready.1"));
  ::kill(ddprun, SIGTERM);
  RunResult r = wait(ddprun);
  EXPECT_EQ(r.exit_code, kRequeueExitStatus) << r.err;
  EXPECT_NE(r.err.find("stopped on request after SIGTERM"), std::string::npos) << r.err;
  expect_no_survivors();
}

TEST_F(DdprunRequeue, SignalsToHandleForwardsTheListedOnesOnly) {
  pid_t ddprun = start({"--signals-to-handle", "SIGTERM,SIGINT,SIGUSR1", "--nproc-per-node", "2",
                        worker(), "record-signals", dir(), "ready", dir(), "sleep", "60"});
  ASSERT_TRUE(wait_for_file(dir() + "/ready.0.0"));
  ASSERT_TRUE(wait_for_file(dir() + "/ready.1.0"));
  ::kill(ddprun, SIGUSR1);
  EXPECT_TRUE(wait_for_file(dir() + "/0.0.SIGUSR1"));
  EXPECT_TRUE(wait_for_file(dir() + "/1.0.SIGUSR1"));
  EXPECT_TRUE(still_running(ddprun)) << "a listed SIGUSR1 must not stop ddprun";
  // Not listed: its default action ends ddprun, and the workers die with it (PDEATHSIG).
  ::kill(ddprun, SIGUSR2);
  RunResult r = wait(ddprun);
  EXPECT_EQ(r.signal, SIGUSR2) << r.err;
  EXPECT_FALSE(file_exists(dir() + "/0.0.SIGUSR2"));
  expect_no_survivors();
}

TEST_F(DdprunRequeue, AnUnknownSignalNameIsAUsageError) {
  RunResult r = run({"--signals-to-handle", "SIGTERM,SIGKILL", worker(), "exit", "0"});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--signals-to-handle 'SIGTERM,SIGKILL': 'SIGKILL' is not a signal ddprun "
                       "can handle; use a comma-separated list of SIGINT, SIGTERM, SIGHUP, "
                       "SIGQUIT, SIGUSR1, SIGUSR2"),
            std::string::npos)
      << r.err;
  r = run({worker(), "exit", "0"}, {{"PET_SIGNALS_TO_HANDLE", "usr1,BOGUS"}});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("PET_SIGNALS_TO_HANDLE 'usr1,BOGUS': 'BOGUS'"), std::string::npos) << r.err;
}

TEST_F(DdprunRequeue, ShutdownTimeoutIsTheGraceBeforeSigkill) {
  pid_t ddprun = start({"--shutdown-timeout", "0.3", "--nproc-per-node", "1", worker(),
                        "ignore-term", "ready", dir(), "sleep", "60"});
  ASSERT_TRUE(wait_for_file(dir() + "/ready.0.0"));
  ::kill(ddprun, SIGTERM);
  RunResult r = wait(ddprun);
  EXPECT_EQ(r.exit_code, 128 + SIGTERM) << r.err;
  EXPECT_NE(r.err.find("workers still running 0.3 s after SIGTERM; sending SIGKILL"),
            std::string::npos)
      << r.err;
  expect_no_survivors();
}

}  // namespace
}  // namespace ddp::launcher::testing
