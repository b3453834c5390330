#pragma once
// Start-of-training agreement between ranks: the same parameters everywhere, then rank 0's
// values everywhere.

#include <torch/torch.h>

#include <string>
#include <vector>

#include "ddp/comm/process_group.hpp"

namespace ddp {

struct NamedTensor {
  std::string name;
  torch::Tensor tensor;
};

// Checks that every rank holds the same names, shapes, dtypes (and requires_grad) in the same
// order. Exchanges one 64-bit hash; only on a mismatch are the full descriptions gathered, and
// every rank throws the same UsageError naming the first differing entry and the ranks.
// Collective: every rank must call it.
void verify_same_tensors(ProcessGroup& pg, const std::vector<NamedTensor>& tensors,
                         const std::string& what, std::chrono::milliseconds timeout);

// Overwrites every tensor with root's values (in place, any layout: non-contiguous tensors go
// through a contiguous copy). Collective.
void broadcast_tensors(ProcessGroup& pg, const std::vector<torch::Tensor>& tensors, int root,
                       std::chrono::milliseconds timeout);

}  // namespace ddp
