#pragma once
// The random state a module's training draws from: the CPU default generator, and the default
// generator of the CUDA device the module lives on (dropout on the GPU draws there), if any.
// Checkpoints keep it per rank; in-place recovery rewinds it when a step is dropped and sends
// the source's to the ranks it heals, so randomness continues as without the failure.

#include <torch/nn/module.h>

#include <optional>

namespace ddp {

// The CUDA device of the module's first CUDA parameter or buffer; nullopt for a CPU module.
std::optional<c10::Device> cuda_device_of(const torch::nn::Module& module);

struct RandomState {
  torch::Tensor cpu;   // the CPU default generator's state (uint8, on the CPU)
  torch::Tensor cuda;  // the module's CUDA device's generator state; undefined for a CPU module
};

// `cuda_device`: the module's (cuda_device_of, found once: it walks every parameter), or nullopt.
RandomState capture_random_state(std::optional<c10::Device> cuda_device);
// Sets the generators `state` has a state for (the CUDA one on `cuda_device`, when given).
void restore_random_state(std::optional<c10::Device> cuda_device, const RandomState& state);

}  // namespace ddp
