#pragma once
// TensorDataset: a dataset held in memory as two tensors whose first dimension indexes
// samples (inputs and targets), like torch.utils.data.TensorDataset. The IDX (MNIST) and
// synthetic datasets load into one; batches are gathered with index_select, so a batch costs
// one copy whatever the sampler's order.

#include <torch/types.h>

#include <cstdint>
#include <vector>

namespace ddp {

struct Batch {
  torch::Tensor data;
  torch::Tensor target;
};

class TensorDataset {
 public:
  TensorDataset() = default;
  // Throws UsageError when the first dimensions differ or a tensor has no dimension.
  TensorDataset(torch::Tensor data, torch::Tensor target);

  int64_t size() const { return data_.defined() ? data_.size(0) : 0; }
  const torch::Tensor& data() const { return data_; }
  const torch::Tensor& target() const { return target_; }

  // The samples at `indices`, stacked along a new first dimension. Throws UsageError naming
  // the bad index when one is outside [0, size()).
  Batch get_batch(const std::vector<int64_t>& indices) const;

 private:
  torch::Tensor data_;
  torch::Tensor target_;
};

}  // namespace ddp
