#pragma once
// Helpers shared by zero_redundancy_optimizer.cpp and zero_recovery.cpp (not installed).

#include <torch/optim/optimizer.h>

#include <string>

#include "ddp/comm/process_group.hpp"

namespace ddp::zero_detail {

// LibTorch's archive of `optimizer` as bytes, and back.
std::string archive_bytes(const torch::optim::Optimizer& optimizer);
void load_bytes(torch::optim::Optimizer& optimizer, const std::string& bytes);

// Waits for `work` (on the current stream with nccl), naming `what` when it timed out.
void wait_for(ProcessGroup& pg, Work& work, const std::string& what);

// `bytes` from `root` to every rank (the others' `bytes` are replaced). Collective.
void broadcast_bytes(ProcessGroup& pg, std::string& bytes, int root);

}  // namespace ddp::zero_detail
