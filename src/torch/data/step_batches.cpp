#include "ddp/torch/data/step_batches.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "ddp/util/error.hpp"

namespace ddp {

StepBatches::StepBatches(StepBatchesOptions options) : options_(options) {
  if (options_.batch_size < 1 || options_.launch_world_size < 1) {
    throw UsageError(
        fmt::format("StepBatches: batch_size ({}) and launch_world_size ({}) must be at least 1",
                    options_.batch_size, options_.launch_world_size));
  }
  split(options_.launch_world_size);
  launch_steps_per_epoch_ = steps_per_epoch_;
}

void StepBatches::split(int shares) {
  samplers_.clear();
  for (int share = 0; share < shares; ++share) {
    samplers_.emplace_back(options_.dataset_size,
                           DistributedSamplerOptions(shares, share).seed(options_.seed));
  }
  steps_per_epoch_ = samplers_.front().num_samples() / options_.batch_size;
  if (steps_per_epoch_ < 1) {
    throw UsageError(fmt::format(
        "StepBatches: {} samples split into {} shares leave {} per share, less than one batch "
        "of {}; use a smaller batch size",
        options_.dataset_size, shares, samplers_.front().num_samples(), options_.batch_size));
  }
  indices_.assign(static_cast<size_t>(shares), {});
  epoch_ = -1;
}

std::vector<int64_t> StepBatches::indices(int64_t step, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) {
    throw UsageError(
        fmt::format("StepBatches::indices: rank {} outside a world of {}", rank, world));
  }
  const int shares = std::max(options_.launch_world_size, world);
  if (shares != static_cast<int>(samplers_.size())) split(shares);
  const int64_t epoch = options_.first_epoch + step / steps_per_epoch_;
  if (epoch != epoch_) {
    for (int share = 0; share < shares; ++share) {
      samplers_[share].set_epoch(epoch);
      indices_[share] = samplers_[share].indices();
    }
    epoch_ = epoch;
  }
  const int64_t first = (step % steps_per_epoch_) * options_.batch_size;
  std::vector<int64_t> out;
  for (int share = rank; share < shares; share += world) {
    const auto begin = indices_[share].begin() + first;
    out.insert(out.end(), begin, begin + options_.batch_size);
  }
  return out;
}

}  // namespace ddp
