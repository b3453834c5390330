#pragma once
// local_device: the device a rank computes on, from its local rank (one GPU per process, the
// torchrun convention: rank with LOCAL_RANK=k uses cuda:k), and the matching backend.
//
//   torch::Device device = ddp::local_device("auto");   // cuda:LOCAL_RANK, or cpu without GPUs
//   ddp::InitOptions init;
//   init.backend = ddp::default_backend(device);          // "nccl" for CUDA, "cpu" otherwise
//   model->to(device);
//
// The local rank comes from the worker environment (LOCAL_RANK), SLURM_LOCALID or
// OMPI_COMM_WORLD_LOCAL_RANK (world_info.hpp), 0 when none is set.

#include <torch/torch.h>

#include <string>

namespace ddp {

// Resolves a device request:
//   "cpu"      the CPU
//   "cuda"     cuda:<local rank>; UsageError when CUDA is unavailable or the local rank is not
//              below the number of visible devices (names LOCAL_RANK, the count and
//              CUDA_VISIBLE_DEVICES)
//   "cuda:N"   that device; UsageError when it is not visible
//   "auto"     "cuda" when torch::cuda::is_available(), else "cpu"
// Anything else is a UsageError listing the accepted forms.
torch::Device local_device(const std::string& request = "auto");

// The local rank local_device uses (0 when the launcher announced none).
int local_rank();

// "nccl" for a CUDA device, "cpu" for the CPU.
std::string default_backend(const torch::Device& device);

}  // namespace ddp
