// StepBatches: a step's samples as a function of the step and the membership (the launch's
// shares split over the live ranks; more shares once the job grew past its launch size).
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "ddp/torch/data/step_batches.hpp"
#include "ddp/util/error.hpp"

namespace {

ddp::StepBatchesOptions options(int launch_world) {
  ddp::StepBatchesOptions o;
  o.dataset_size = 1000;
  o.batch_size = 8;
  o.launch_world_size = launch_world;
  o.seed = 5;
  return o;
}

// Every rank's indices of `step` in a world of `world`, concatenated and sorted.
std::vector<int64_t> global_batch(ddp::StepBatches& batches, int64_t step, int world) {
  std::vector<int64_t> all;
  for (int rank = 0; rank < world; ++rank) {
    const std::vector<int64_t> mine = batches.indices(step, rank, world);
    all.insert(all.end(), mine.begin(), mine.end());
  }
  std::sort(all.begin(), all.end());
  return all;
}

TEST(StepBatches, EachLaunchRankTakesOneBatchOfItsSamplerShare) {
  ddp::StepBatches batches(options(4));
  EXPECT_EQ(batches.launch_steps_per_epoch(), 1000 / 4 / 8);
  const int64_t steps = batches.launch_steps_per_epoch();
  // Step `steps + 2` is batch 2 of epoch 1 of each share.
  ddp::DistributedSampler share(1000, ddp::DistributedSamplerOptions(4, 3).seed(5));
  share.set_epoch(1);
  const std::vector<int64_t> all = share.indices();
  const std::vector<int64_t> expected(all.begin() + 16, all.begin() + 24);
  EXPECT_EQ(batches.indices(steps + 2, 3, 4), expected);
  EXPECT_EQ(batches.epoch(), 1);
}

TEST(StepBatches, SurvivorsOfALostNodeTrainOnTheSameSamples) {
  ddp::StepBatches batches(options(4));
  for (int64_t step : {0, 7, 40}) {
    const std::vector<int64_t> launch = global_batch(batches, step, 4);
    EXPECT_EQ(launch.size(), 32u);
    EXPECT_EQ(global_batch(batches, step, 2), launch) << "step " << step;
    EXPECT_EQ(global_batch(batches, step, 3), launch) << "step " << step;
    // Rank 0 of 2 takes shares 0 and 2.
    std::vector<int64_t> shares02 = batches.indices(step, 0, 4);
    const std::vector<int64_t> share2 = batches.indices(step, 2, 4);
    shares02.insert(shares02.end(), share2.begin(), share2.end());
    EXPECT_EQ(batches.indices(step, 0, 2), shares02);
  }
}

TEST(StepBatches, RanksOfAGrownJobBringSharesOfTheirOwn) {
  ddp::StepBatches batches(options(4));
  const std::vector<int64_t> grown = global_batch(batches, 3, 6);
  EXPECT_EQ(grown.size(), 48u);
  EXPECT_EQ(std::adjacent_find(grown.begin(), grown.end()), grown.end())
      << "two ranks of a grown job trained on the same sample in one step";
  ddp::DistributedSampler share(1000, ddp::DistributedSamplerOptions(6, 5).seed(5));
  share.set_epoch(0);
  const std::vector<int64_t> all = share.indices();
  const std::vector<int64_t> expected(all.begin() + 24, all.begin() + 32);
  EXPECT_EQ(batches.indices(3, 5, 6), expected);
  // Back to the launch's split once the grown node is lost again.
  EXPECT_EQ(global_batch(batches, 3, 4).size(), 32u);
  EXPECT_EQ(batches.launch_steps_per_epoch(), 1000 / 4 / 8);
}

TEST(StepBatches, BadOptionsAndRanksAreUsageErrors) {
  ddp::StepBatchesOptions o = options(4);
  o.batch_size = 0;
  EXPECT_THROW(ddp::StepBatches{o}, ddp::UsageError);
  o = options(0);
  EXPECT_THROW(ddp::StepBatches{o}, ddp::UsageError);
  o = options(4);
  o.batch_size = 300;  // 250 samples per share
  EXPECT_THROW(ddp::StepBatches{o}, ddp::UsageError);
  ddp::StepBatches batches(options(4));
  EXPECT_THROW(batches.indices(0, 2, 2), ddp::UsageError);
}

}  // namespace
