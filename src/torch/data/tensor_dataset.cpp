#include "ddp/torch/data/tensor_dataset.hpp"

#include <torch/torch.h>

#include <string>

#include "ddp/util/error.hpp"

namespace ddp {

TensorDataset::TensorDataset(torch::Tensor data, torch::Tensor target)
    : data_(std::move(data)), target_(std::move(target)) {
  if (!data_.defined() || !target_.defined() || data_.dim() == 0 || target_.dim() == 0) {
    throw UsageError(
        "TensorDataset: data and target must be tensors with at least one "
        "dimension (the sample index)");
  }
  if (data_.size(0) != target_.size(0)) {
    throw UsageError("TensorDataset: data has " + std::to_string(data_.size(0)) +
                     " samples but target has " + std::to_string(target_.size(0)) +
                     "; both need the same first dimension");
  }
}

Batch TensorDataset::get_batch(const std::vector<int64_t>& indices) const {
  const int64_t n = size();
  for (int64_t i : indices) {
    if (i < 0 || i >= n) {
      throw UsageError("TensorDataset: index " + std::to_string(i) + " is outside [0, " +
                       std::to_string(n) + "); the sampler was built for another dataset size");
    }
  }
  // from_blob does not copy; index_select copies the selected rows once.
  auto idx = torch::from_blob(const_cast<int64_t*>(indices.data()),
                              {static_cast<int64_t>(indices.size())}, torch::kLong);
  return Batch{data_.index_select(0, idx), target_.index_select(0, idx)};
}

}  // namespace ddp
