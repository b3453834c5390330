#pragma once
// FusedAdam: torch::optim::Adam whose update of a float32 CPU parameter is one pass over memory.
//
// Why: torch::optim::Adam runs about ten tensor operations per parameter (mul_, add_, mul_,
// addcmul_, sqrt, div, add_, addcdiv_ and their temporaries), each a full pass over the
// parameter, its gradient or a moment. For the tutorials' CNN (1.2 M parameters) that is about
// 100 MB of memory traffic per step: 1.7-2 ms of a 40 ms step on one core, more when two ranks
// on one machine run their optimizer steps at the same moment, as DDP's lockstep makes them.
// FusedAdam reads each element once and writes it once (34 MB), like PyTorch's
// `torch.optim.Adam(fused=True)`.
//
// Contract: a drop-in for torch::optim::Adam. The same constructors and AdamOptions (lr, betas,
// eps, weight_decay as an L2 penalty, amsgrad), the same per-parameter state (AdamParamState)
// and the same save/load, so an optimizer state saved by one loads into the other and training
// goes on. The arithmetic follows torch::optim::Adam's order of operations in float32; results
// agree to rounding (a few ulp per step), not bit for bit. Parameters that are not contiguous
// dense float32 CPU tensors with a gradient of the same layout (other dtypes, CUDA, sparse
// gradients) take the same tensor operations as torch::optim::Adam. Large parameters are
// split over LibTorch's intra-op threads (torch::set_num_threads).
#include <torch/optim/adam.h>

namespace ddp {

class FusedAdam : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;

  torch::Tensor step(LossClosure closure = nullptr) override;

  // How the last step() updated the parameters that had a gradient: with the fused kernel or
  // with tensor operations (a parameter that should be fast but is not shows up here).
  struct StepPaths {
    int64_t fused = 0;
    int64_t unfused = 0;
  };
  const StepPaths& last_step_paths() const { return last_step_paths_; }

 private:
  StepPaths last_step_paths_;
};

}  // namespace ddp
