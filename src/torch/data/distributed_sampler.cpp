#include "ddp/torch/data/distributed_sampler.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <numeric>
#include <string>

#include "ddp/util/error.hpp"

namespace ddp {

namespace {

int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}

// PyTorch's permutation: the CPU generator seeded like Generator().manual_seed(seed), then
// randperm's Fisher-Yates over mt19937. dtype is pinned to int64: a default-constructed
// TensorOptions would ask for float, which is exact only up to 2^24.
std::vector<int64_t> torch_randperm(int64_t n, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  at::Tensor perm = torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kLong));
  const int64_t* p = perm.data_ptr<int64_t>();
  return std::vector<int64_t>(p, p + n);
}

}  // namespace

DistributedSampler::DistributedSampler(int64_t dataset_size, DistributedSamplerOptions options)
    : dataset_size_(dataset_size), options_(options) {
  const int64_t r = options_.num_replicas_;
  if (r < 1) {
    throw UsageError("DistributedSampler: num_replicas=" + std::to_string(r) +
                     " must be at least 1 (pass the world size)");
  }
  if (options_.rank_ < 0 || options_.rank_ >= r) {
    throw UsageError("DistributedSampler: invalid rank " + std::to_string(options_.rank_) +
                     ", rank should be in the interval [0, " + std::to_string(r - 1) + "]");
  }
  if (dataset_size < 0) {
    throw UsageError("DistributedSampler: dataset size " + std::to_string(dataset_size) +
                     " is negative");
  }
  if (options_.drop_last_ && dataset_size % r != 0) {
    // Python's math.ceil((N - R) / R) on a float; for N < R this is <= 0.
    num_samples_ = dataset_size >= r ? ceil_div(dataset_size - r, r) : 0;
  } else {
    num_samples_ = ceil_div(dataset_size, r);
  }
  total_size_ = num_samples_ * r;
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> all;
  if (options_.shuffle_) {
    all = torch_randperm(dataset_size_, options_.seed_ + static_cast<uint64_t>(epoch_));
  } else {
    all.resize(dataset_size_);
    std::iota(all.begin(), all.end(), int64_t{0});
  }

  if (!options_.drop_last_) {
    // Pad with the head of the permutation, cycled when padding exceeds N (PyTorch's
    // `(indices * ceil(padding / N))[:padding]`).
    const int64_t n = static_cast<int64_t>(all.size());
    const int64_t padding = total_size_ - n;
    all.reserve(total_size_);
    for (int64_t i = 0; i < padding; ++i) all.push_back(all[i % n]);
  } else {
    all.resize(total_size_);
  }

  std::vector<int64_t> mine;
  mine.reserve(num_samples_);
  for (int64_t i = options_.rank_; i < total_size_; i += options_.num_replicas_) {
    mine.push_back(all[i]);
  }
  return mine;
}

}  // namespace ddp
