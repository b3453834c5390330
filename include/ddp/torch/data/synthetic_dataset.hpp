#pragma once
// The tutorials' MyTrainDataset: `size` random pairs (x of `input_size` floats, y of
// `target_size` floats), uniform in [0, 1). Seeded, so every rank and every restart builds the
// same data. Sample i equals Python's
//   g = torch.Generator(); g.manual_seed(seed)
//   data = [(torch.rand(20, generator=g), torch.rand(1, generator=g)) for _ in range(size)]
// (the tutorial itself draws from the unseeded global generator).

#include <cstdint>

#include "ddp/torch/data/tensor_dataset.hpp"

namespace ddp {

struct SyntheticOptions {
  static constexpr int64_t kSize = 2048;
  static constexpr int64_t kInputSize = 20;
  static constexpr int64_t kTargetSize = 1;
  static constexpr uint64_t kSeed = 0;

  SyntheticOptions& size(int64_t v) {
    size_ = v;
    return *this;
  }
  SyntheticOptions& input_size(int64_t v) {
    input_size_ = v;
    return *this;
  }
  SyntheticOptions& target_size(int64_t v) {
    target_size_ = v;
    return *this;
  }
  SyntheticOptions& seed(uint64_t v) {
    seed_ = v;
    return *this;
  }

  int64_t size_ = kSize;
  int64_t input_size_ = kInputSize;
  int64_t target_size_ = kTargetSize;
  uint64_t seed_ = kSeed;
};

// data float32 [size, input_size], target float32 [size, target_size]. Throws UsageError on a
// negative size or non-positive feature sizes.
TensorDataset make_synthetic_dataset(const SyntheticOptions& options = SyntheticOptions());

}  // namespace ddp
