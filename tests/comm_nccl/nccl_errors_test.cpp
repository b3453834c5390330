// Error paths of the NCCL backend. Argument checks run before CUDA is touched and are tested
// everywhere; the rest needs a GPU (and the watchdog test two) and skips otherwise.

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <thread>

#include "../support/throws_with.hpp"
#include "ddp/comm/nccl_process_group.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/util/error.hpp"
#include "device_buffer.hpp"

namespace ddp::test {
namespace {

constexpr std::chrono::milliseconds kErrorsTimeout{std::chrono::seconds(60)};

TEST(NcclErrors, RankOutsideTheGroupIsAUsageError) {
  auto store = std::make_shared<HashStore>();
  EXPECT_TRUE(
      throws_with<UsageError>([&] { make_nccl_process_group(store, 2, 2, 0, kErrorsTimeout); },
                              {"rank 2 and size 2", "0 <= rank < size"}));
}

TEST(NcclErrors, NullStoreIsAUsageError) {
  EXPECT_TRUE(throws_with<UsageError>(
      [] { make_nccl_process_group(nullptr, 0, 1, 0, kErrorsTimeout); }, {"store is null"}));
}

TEST(NcclErrors, MalformedWatchdogIntervalIsAUsageError) {
  ::setenv("DDP_NCCL_WATCHDOG_INTERVAL_MS", "0", 1);
  const auto result = throws_with<UsageError>([] { NcclOptions::from_env(kErrorsTimeout); },
                                              {"DDP_NCCL_WATCHDOG_INTERVAL_MS=0"});
  ::unsetenv("DDP_NCCL_WATCHDOG_INTERVAL_MS");
  EXPECT_TRUE(result);
}

TEST(NcclErrors, BlockingWaitComesFromTheEnvironment) {
  ::setenv("DDP_NCCL_BLOCKING_WAIT", "1", 1);
  const NcclOptions options = NcclOptions::from_env(kErrorsTimeout);
  ::unsetenv("DDP_NCCL_BLOCKING_WAIT");
  EXPECT_TRUE(options.blocking_wait);
  EXPECT_EQ(options.timeout, kErrorsTimeout);
  EXPECT_FALSE(NcclOptions::from_env(kErrorsTimeout).blocking_wait);
}

TEST(NcclErrors, NoVisibleGpuIsAUsageErrorNamingTheFix) {
  if (visible_gpus() > 0) GTEST_SKIP() << "a GPU is visible; this test covers machines without one";
  auto store = std::make_shared<HashStore>();
  EXPECT_TRUE(
      throws_with<UsageError>([&] { make_nccl_process_group(store, 0, 1, 0, kErrorsTimeout); },
                              {"no CUDA device is visible", "cpu backend"}));
}

using NcclGpuErrors = GpuTest;

TEST_F(NcclGpuErrors, InvisibleDeviceIsAUsageError) {
  auto store = std::make_shared<HashStore>();
  EXPECT_TRUE(
      throws_with<UsageError>([&] { make_nccl_process_group(store, 0, 1, 99, kErrorsTimeout); },
                              {"device 99 is not visible"}));
}

TEST_F(NcclGpuErrors, HostMemoryIsAUsageError) {
  auto store = std::make_shared<HashStore>();
  auto pg = make_nccl_process_group(store, 0, 1, 0, kErrorsTimeout);
  float host[4] = {1, 2, 3, 4};
  EXPECT_TRUE(throws_with<UsageError>(
      [&] { pg->all_reduce(host, 4, DataType::kFloat32, ReduceOp::kSum); }, {"host memory"}));
}

TEST_F(NcclGpuErrors, MissingRankAtInitIsATimeout) {
  // Rank 1 of 2 never joins: rank 0's init must give up after the timeout.
  auto store = std::make_shared<HashStore>();
  EXPECT_TRUE(throws_with<TimeoutError>(
      [&] { make_nccl_process_group(store, 0, 2, 0, std::chrono::milliseconds(2000)); },
      {"joining the 2-rank NCCL communicator", "did not finish within 2000 ms"}));
}

TEST_F(NcclGpuErrors, WatchdogAbortsACollectiveAPeerNeverJoins) {
  if (visible_gpus() < 2) GTEST_SKIP() << "needs 2 GPUs: rank 1 must exist to not join";
  auto store = std::make_shared<HashStore>();
  NcclOptions options;
  options.timeout = std::chrono::milliseconds(1500);
  options.blocking_wait = true;
  options.watchdog_interval = std::chrono::milliseconds(20);
  ProcessGroupPtr groups[2];
  std::thread peer([&] {
    cudaSetDevice(1);
    groups[1] = make_nccl_process_group(store, 1, 2, 1, options);
  });
  cudaSetDevice(0);
  groups[0] = make_nccl_process_group(store, 0, 2, 0, options);
  peer.join();
  ASSERT_TRUE(groups[1]);
  DeviceBuffer buffer(DataType::kFloat32, 16);
  auto work = groups[0]->all_reduce(buffer.data(), 16, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_TRUE(throws_with<CollectiveError>(
      [&] { work->wait(kErrorsTimeout); },
      {"rank 0 of 2", "all_reduce(sum, float32 x 16)", "sequence 1", "watchdog aborted"}));
  EXPECT_TRUE(throws_with<CollectiveError>(
      [&] { groups[0]->all_reduce(buffer.data(), 16, DataType::kFloat32, ReduceOp::kSum); },
      {"watchdog aborted"}));
}

}  // namespace
}  // namespace ddp::test
