#pragma once
// The forward outputs' sink (PyTorch's _DDPSink): a way for the Reducer to run code when a
// backward through a forward's outputs starts, inside that backward's own graph task.
//
// Why: the Reducer finalizes a backward with an autograd final callback, which the engine runs
// when the graph task that queued it ends. Queued from a gradient hook, that is the task the
// hook ran in; with reentrant backward (activation checkpointing: backward called inside a
// backward) the first hooks may run in the inner task, which ends long before the outer one.
// The sink's node sits between the outputs and everything computed from them, so its backward
// runs first, in the outer task.

#include <torch/torch.h>

#include <functional>
#include <vector>

namespace ddp {

// Returns `outputs` with every tensor that requires grad replaced by a copy whose gradient
// flows through one identity node; `on_backward` runs when a backward reaches that node (once
// per backward that does). Tensors that need no gradient are returned as they are. Returns an
// empty vector when no output requires grad (nothing to replace).
std::vector<torch::Tensor> pass_through_sink(const std::vector<torch::Tensor>& outputs,
                                             std::function<void()> on_backward);

}  // namespace ddp
