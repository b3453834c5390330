// Error paths of the MPI backend: bad arguments are UsageErrors naming the parameter and the
// fix (raised before any MPI call, so the ranks stay in step), a missing rank is a
// TimeoutError naming the collective and the rank, and a mismatched recv is a
// CollectiveError.

#include <gtest/gtest.h>

#include <climits>
#include <cstdlib>
#include <string>

#include "../support/throws_with.hpp"
#include "ddp/util/error.hpp"
#include "mpi_world.hpp"

namespace ddp::test {
namespace {

TEST(MpiErrors, RootOutsideTheGroupIsAUsageError) {
  ProcessGroup& pg = world();
  float x = 0;
  const int bad = pg.size();
  EXPECT_TRUE(throws_with<UsageError>([&] { pg.broadcast(&x, 1, DataType::kFloat32, bad); },
                                      {"broadcast", "root", "not a rank of this group"}));
  EXPECT_TRUE(throws_with<UsageError>(
      [&] { pg.reduce(&x, 1, DataType::kFloat32, ReduceOp::kSum, -1); }, {"reduce", "root -1"}));
  EXPECT_TRUE(throws_with<UsageError>([&] { pg.send(&x, 1, DataType::kFloat32, bad, 0); },
                                      {"send", "dst", "not a rank"}));
}

TEST(MpiErrors, NegativeTagIsAUsageError) {
  ProcessGroup& pg = world();
  float x = 0;
  EXPECT_TRUE(throws_with<UsageError>([&] { pg.recv(&x, 1, DataType::kFloat32, 0, -3); },
                                      {"tag -3", "tag range"}));
}

TEST(MpiErrors, CountsListOfTheWrongLengthIsAUsageError) {
  ProcessGroup& pg = world();
  float x = 0;
  float out[8] = {};
  std::vector<size_t> counts(pg.size() + 1, 1);
  EXPECT_TRUE(throws_with<UsageError>([&] { pg.all_gather_v(&x, out, counts, DataType::kFloat32); },
                                      {"all_gather_v", "one count per rank"}));
}

TEST(MpiErrors, CountBeyondIntIsAUsageErrorNotATruncation) {
  ProcessGroup& pg = world();
  float x = 0;
  const size_t huge = static_cast<size_t>(INT_MAX) + 1;
  EXPECT_TRUE(
      throws_with<UsageError>([&] { pg.all_reduce(&x, huge, DataType::kFloat32, ReduceOp::kSum); },
                              {"all_reduce", "int count limit", "split the buffer"}));
}

TEST(MpiErrors, NullBufferWithElementsIsAUsageError) {
  ProcessGroup& pg = world();
  EXPECT_TRUE(throws_with<UsageError>(
      [&] { pg.all_reduce(nullptr, 4, DataType::kInt32, ReduceOp::kMax); }, {"data is null"}));
}

TEST(MpiErrors, WorldSizeThatContradictsMpiIsAUsageError) {
  const std::string fake = std::to_string(world().size() + 5);
  ::setenv("WORLD_SIZE", fake.c_str(), 1);
  const auto result = throws_with<UsageError>([] { make_mpi_process_group(kTimeout); },
                                              {"WORLD_SIZE", "mpirun -np"});
  ::unsetenv("WORLD_SIZE");
  EXPECT_TRUE(result);
}

TEST(MpiErrors, MissingRankTimesOutNamingTheCollectiveThenRecovers) {
  ProcessGroup& pg = world();
  if (pg.size() < 2) GTEST_SKIP() << "needs 2 ranks: run under mpirun -np 2";
  // Rank 1 joins the barrier only after rank 0 has seen it time out, so rank 0's timeout is
  // certain; the barrier then completes when waited again.
  int32_t go = 0;
  if (pg.rank() == 1) {
    pg.recv(&go, 1, DataType::kInt32, 0, 77)->wait(kTimeout);
    EXPECT_EQ(go, 1);
    pg.barrier()->wait(kTimeout);
    return;
  }
  auto barrier = pg.barrier();
  if (pg.rank() == 0) {
    EXPECT_TRUE(
        throws_with<TimeoutError>([&] { barrier->wait(std::chrono::milliseconds(50)); },
                                  {"barrier", "rank 0 of", "did not complete within 50 ms"}));
    EXPECT_FALSE(barrier->is_completed());
    go = 1;
    pg.send(&go, 1, DataType::kInt32, 1, 77)->wait(kTimeout);
  }
  barrier->wait(kTimeout);
  EXPECT_TRUE(barrier->is_completed());
}

TEST(MpiErrors, RecvOfTheWrongCountIsACollectiveError) {
  ProcessGroup& pg = world();
  if (pg.size() < 2) GTEST_SKIP() << "needs 2 ranks: run under mpirun -np 2";
  int32_t data[5] = {1, 2, 3, 4, 5};
  if (pg.rank() == 0) {
    pg.send(data, 3, DataType::kInt32, 1, 5)->wait(kTimeout);
  } else if (pg.rank() == 1) {
    auto work = pg.recv(data, 5, DataType::kInt32, 0, 5);
    EXPECT_TRUE(throws_with<CollectiveError>([&] { work->wait(kTimeout); },
                                             {"received 3 elements but expected 5"}));
  }
}

}  // namespace
}  // namespace ddp::test
