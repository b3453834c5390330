#pragma once
// Helpers shared by zero_redundancy_optimizer.cpp and zero_recovery.cpp (not installed).

#include <torch/optim/optimizer.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "ddp/comm/process_group.hpp"

namespace ddp::zero_detail {

// LibTorch's archive of `optimizer` as bytes, and back.
std::string archive_bytes(const torch::optim::Optimizer& optimizer);
void load_bytes(torch::optim::Optimizer& optimizer, const std::string& bytes);

// Waits for `work` (on the current stream with nccl), naming `what` when it timed out.
void wait_for(ProcessGroup& pg, Work& work, const std::string& what);

// `bytes` from `root` to every rank (the others' `bytes` are replaced). Collective.
void broadcast_bytes(ProcessGroup& pg, std::string& bytes, int root);

// A shard's parameters per group.
using Shard = std::vector<std::vector<torch::Tensor>>;
// Its element count, and its parameters flattened in shard order into one tensor of `options`.
int64_t shard_numel(const Shard& shard);
torch::Tensor flatten_shard(const Shard& shard, const torch::TensorOptions& options);

}  // namespace ddp::zero_detail
