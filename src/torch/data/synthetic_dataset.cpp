#include "ddp/torch/data/synthetic_dataset.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include "ddp/util/error.hpp"

namespace ddp {

TensorDataset make_synthetic_dataset(const SyntheticOptions& o) {
  if (o.size_ < 0 || o.input_size_ < 1 || o.target_size_ < 1) {
    throw UsageError(
        fmt::format("synthetic dataset: size={} input_size={} target_size={}; size "
                    "must be >= 0 and feature sizes >= 1",
                    o.size_, o.input_size_, o.target_size_));
  }
  auto gen = at::make_generator<at::CPUGeneratorImpl>(o.seed_);
  auto data = torch::empty({o.size_, o.input_size_});
  auto target = torch::empty({o.size_, o.target_size_});
  // Drawn sample by sample, x then y, so the stream of random numbers is the tutorial's.
  for (int64_t i = 0; i < o.size_; ++i) {
    data[i].copy_(torch::rand({o.input_size_}, gen));
    target[i].copy_(torch::rand({o.target_size_}, gen));
  }
  return TensorDataset(data, target);
}

}  // namespace ddp
