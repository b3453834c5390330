// How a Gloo failure spreads: when a rank leaves (its connections close), every rank still in
// the collective must fail at once with the connection error, including a rank that was
// waiting on another survivor rather than on the rank that left. A survivor keeps its group
// (as DDP and in-place recovery do while they decide what to do), so its sockets stay open
// unless the failed communicator closes them itself (GlooComm::close_connections): then the
// rank waiting on it would sit out the whole group timeout (seen in CI: rank 2 died, rank 1
// saw it, rank 0 waited on rank 1 for 60 s).

#include <gtest/gtest.h>

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

}  // namespace
}  // namespace ddp::test
