#pragma once
// StepBatches: the data of a training step under ddp::StepManager (ddprun --recovery step) as
// a pure function of the step and the current membership, so that a dropped and redone step, a
// healed replacement and a survivor of a lost node all read the same samples for a step.
//
// The data is split into shares, one DistributedSampler each (PyTorch's order): one share per
// slot of the job, i.e. the launch's world size, or the current world size when nodes grew the
// job past it. A step's global batch is one batch of every share; rank r of a world of W takes
// the shares s with s % W == r. So after a lost node the survivors also train on the lost
// ranks' shares (the step averages the same samples as without the loss), and ranks that grew
// the job bring shares of their own (a larger global batch, as an elastic restart with more
// workers has).
//
// Step s reads batch s % steps_per_epoch of sampler epoch first_epoch + s / steps_per_epoch,
// with the steps per epoch of the current share count: when the job grows, the epoch in
// progress is not finished, the next step starts at its place in the larger split (the samples
// of a step stay a function of the step and the membership, which is what the guarantees of
// docs/recovery.md need).

#include <cstdint>
#include <vector>

#include "ddp/torch/data/distributed_sampler.hpp"

namespace ddp {

struct StepBatchesOptions {
  int64_t dataset_size = 0;
  int64_t batch_size = 1;     // per share
  int launch_world_size = 1;  // StepManager::launch_world_size()
  uint64_t seed = 0;          // the samplers' seed
  int64_t first_epoch = 0;    // the sampler epoch of step 0
};

class StepBatches {
 public:
  // Throws UsageError when batch_size or launch_world_size is below 1, or one share of the
  // dataset holds less than one batch.
  explicit StepBatches(StepBatchesOptions options);

  // Steps per epoch at the launch's world size (a job's length in steps is fixed from it).
  int64_t launch_steps_per_epoch() const { return launch_steps_per_epoch_; }

  // The dataset indices rank `rank` of `world` (StepManager::rank(), world_size()) trains on in
  // step `step`: batch_size indices of each of its shares. Throws UsageError on a rank outside
  // the world.
  std::vector<int64_t> indices(int64_t step, int rank, int world);

  // The sampler epoch of the last step indices() was asked for (-1 before).
  int64_t epoch() const { return epoch_; }

 private:
  void split(int shares);

  StepBatchesOptions options_;
  int64_t launch_steps_per_epoch_ = 0;
  std::vector<DistributedSampler> samplers_;   // one per share
  int64_t steps_per_epoch_ = 0;                // of samplers_
  int64_t epoch_ = -1;                         // whose indices_ hold
  std::vector<std::vector<int64_t>> indices_;  // of each share, epoch_
};

}  // namespace ddp
