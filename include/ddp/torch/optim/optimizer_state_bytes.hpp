#pragma once
// optimizer_state_bytes: how much memory an optimizer's per-parameter state holds, for
// comparing ZeroRedundancyOptimizer's shards with an unsharded optimizer.

#include <torch/optim/optimizer.h>

#include <cstddef>

namespace ddp {

// Sum of the bytes of the tensors in `optimizer.state()`: Adam/AdamW moments (and
// max_exp_avg_sq), SGD momentum buffers, RMSprop and Adagrad buffers. The state of another
// optimizer type is counted by the size of its serialized form (an approximation).
size_t optimizer_state_bytes(const torch::optim::Optimizer& optimizer);

}  // namespace ddp
