// How a Gloo failure spreads: when a rank leaves (its connections close), every rank still in
// the collective must fail at once with the connection error, including a rank that was
// waiting on another survivor rather than on the rank that left. A survivor keeps its group
// (as DDP and in-place recovery do while they decide what to do), so its sockets stay open
// unless the failed communicator closes them itself (GlooComm::close_connections): then the
// rank waiting on it would sit out the whole group timeout (seen in CI: rank 2 died, rank 1
// saw it, rank 0 waited on rank 1 for 60 s).

#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <thread>
#include <vector>

#include "ddp/comm/init.hpp"
#include "ddp/util/error.hpp"
#include "rank_threads.hpp"

namespace ddp::test {
namespace {

TEST(GlooFailure, EverySurvivorFailsWithTheConnectionErrorNotATimeout) {
  // Four ranks in Gloo's ring: rank 3 leaves; rank 0 receives from it and fails first, rank 1
  // receives only from rank 0. The group timeout (4 s) is shorter than the time each survivor
  // keeps its failed group (6 s): a survivor left waiting on another fails with a TimeoutError.
  const auto timeout = std::chrono::milliseconds(4000);
  auto errors = run_ranks_collect_errors(4, thread_options("gloo", timeout), [](ProcessGroup& pg) {
    std::vector<float> x(1 << 20, 1.0f);
    x[0] = 0;
    pg.all_reduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum)
        ->wait(std::chrono::seconds(60));  // connects every pair first
    if (pg.rank() == 3) return;            // leaves: its group is destroyed, its connections close
    try {
      pg.all_reduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum)
          ->wait(std::chrono::seconds(60));
    } catch (...) {
      std::this_thread::sleep_for(std::chrono::seconds(6));  // keeps the failed group
      throw;
    }
  });
  // No survivor waits out the timeout: each fails on a closed connection.
  for (int r : {0, 1, 2}) {
    EXPECT_EQ(errors[r].find("timed out"), std::string::npos) << "rank " << r << ": " << errors[r];
    EXPECT_NE(errors[r].find("a peer process probably died"), std::string::npos)
        << "rank " << r << ": " << errors[r];
  }
}

struct sigaction sigpipe_action() {
  struct sigaction current {};
  EXPECT_EQ(::sigaction(SIGPIPE, nullptr, &current), 0);
  return current;
}

void set_sigpipe_handler(void (*handler)(int)) {
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  ASSERT_EQ(::sigaction(SIGPIPE, &action, nullptr), 0);
}

void run_two_gloo_ranks() {
  run_ranks(2, thread_options("gloo", std::chrono::milliseconds(30000)),
            [](ProcessGroup& pg) { pg.barrier()->wait(std::chrono::seconds(30)); });
}

// Gloo writes with writev(): with SIGPIPE's default action, a write to a peer that just died
// kills the process instead of failing the collective (a survivor of the test above exited with
// signal 13 under TSan). A C++ worker starts with the default (ddprun resets it), so creating
// a Gloo group must leave SIGPIPE ignored. ctest runs each test in its own process.
TEST(GlooSigpipe, ADefaultSigpipeIsIgnoredOnceAGlooGroupExists) {
  set_sigpipe_handler(SIG_DFL);
  run_two_gloo_ranks();
  EXPECT_EQ(sigpipe_action().sa_handler, SIG_IGN);
}

void program_handler(int) {}

TEST(GlooSigpipe, AHandlerTheProgramInstalledIsKept) {
  set_sigpipe_handler(program_handler);
  run_two_gloo_ranks();
  EXPECT_EQ(sigpipe_action().sa_handler, &program_handler);
  set_sigpipe_handler(SIG_DFL);
}

}  // namespace
}  // namespace ddp::test
