#pragma once
// Named parameters, buffers and state dicts of a module, with the module's own names (no
// wrapper prefix): what DistributedDataParallel exposes, so a state dict or snapshot of the
// wrapper and of the bare module are interchangeable.

#include <torch/torch.h>

#include <string>

namespace ddp {

using StateDict = torch::OrderedDict<std::string, torch::Tensor>;

// Parameters then buffers, recursively, in registration order (PyTorch's state_dict order
// differs per module: parameters and buffers interleave; keys are the same).
StateDict state_dict(const torch::nn::Module& module);

// Copies `state` into the module's parameters and buffers. With strict, a missing or
// unexpected key is a UsageError listing them; a shape mismatch always is.
void load_state_dict(torch::nn::Module& module, const StateDict& state, bool strict = true);

}  // namespace ddp
