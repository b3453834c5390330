// The cpu backend's single-round all_reduce (small messages, one host) compares what every
// rank staged: ranks that call it with another count, dtype or op get a CollectiveError naming
// the peer's call, without DDP_DEBUG_COLLECTIVES (it once reduced slots of different sizes and
// dtypes as if they were alike and returned garbage).
#include <gtest/gtest.h>

#include "ddp/comm/init.hpp"
#include "ddp/util/error.hpp"
#include "rank_threads.hpp"

namespace ddp::test {
namespace {

// Rank 1 calls all_reduce with `count1`/`dtype1`, the others with 16 float32 (sum).
std::vector<std::string> mismatched_all_reduce(size_t count1, DataType dtype1) {
  return run_ranks_collect_errors(3, thread_options("cpu"), [&](ProcessGroup& pg) {
    std::vector<double> data(64, 1.0);  // large enough for either call
    const bool odd = pg.rank() == 1;
    pg.all_reduce(data.data(), odd ? count1 : 16, odd ? dtype1 : DataType::kFloat32, ReduceOp::kSum)
        ->wait(std::chrono::seconds(60));
  });
}

TEST(ShmAllReduceSignature, CountMismatchIsACollectiveErrorOnEveryRank) {
  const auto errors = mismatched_all_reduce(8, DataType::kFloat32);
  for (int r = 0; r < 3; ++r) {
    SCOPED_TRACE("rank " + std::to_string(r));
    ASSERT_FALSE(errors[r].empty()) << "the mismatch went unnoticed";
    EXPECT_NE(errors[r].find(r == 1 ? "issued all_reduce(float32, count=16, sum)"
                                    : "rank 1 issued all_reduce(float32, count=8, sum)"),
              std::string::npos)
        << errors[r];
  }
}

TEST(ShmAllReduceSignature, DtypeMismatchIsACollectiveError) {
  const auto errors = mismatched_all_reduce(8, DataType::kFloat64);  // 64 bytes either way
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errors[r].find("same count, dtype and op"), std::string::npos)
        << "rank " << r << ": " << errors[r];
  }
  EXPECT_NE(errors[0].find("rank 1 issued all_reduce(float64, count=8, sum)"), std::string::npos)
      << errors[0];
}

}  // namespace
}  // namespace ddp::test
