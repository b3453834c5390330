#pragma once
// SyncBatchNorm: batch normalization whose training statistics span every rank of a process
// group, like torch.nn.SyncBatchNorm.
//
//   struct Net : torch::nn::Module {
//     ddp::SyncBatchNorm2d bn{register_module("bn", ddp::SyncBatchNorm2d(16))};
//     ...
//   };
//   ddp::DistributedDataParallel model(net, pg);  // hands pg to every SyncBatchNorm in net
//
// Contract:
// - A drop-in for torch::nn::BatchNorm{1,2,3}d: built from torch::nn::BatchNormOptions, with
//   the same members (weight, bias, running_mean, running_var, num_batches_tracked, options)
//   and the same parameter and buffer names, so state dicts are interchangeable.
// - Training with a group of more than one rank: the per-channel mean and (biased) variance
//   normalizing the batch are those of the union of all ranks' batches. Each rank all-reduces
//   its per-channel sum, sum of squares and element count (counts may differ per rank, zero
//   included), accumulated in float64. Running statistics are updated like torch's BatchNorm
//   with the global statistics (unbiased variance from the global count; momentum, or the
//   cumulative average when momentum is unset), so they stay identical on every rank.
// - Backward is the gradient of the global statistics: when the input needs a gradient, each
//   rank all-reduces its per-channel sum(dy) and sum(dy * (x - mean)). weight and bias
//   gradients stay local to the rank, as DistributedDataParallel averages them afterwards.
// - Forward and backward are collective in training: every rank of the group must run them,
//   in the same order as its other collectives (as any DDP forward/backward must).
// - Eval mode (with running stats), world size 1 or no process group: exactly
//   torch::nn::BatchNorm's computation, no communication.
//
// The process group: set_process_group() sets it explicitly; otherwise DistributedDataParallel
// hands over its own group when it wraps a module holding this layer.

#include <torch/torch.h>

#include <cstddef>
#include <ostream>

#include "ddp/comm/process_group.hpp"

namespace ddp {

// The part of every SyncBatchNorm that does not depend on the dimension: its process group.
class SyncBatchNormBase {
 public:
  virtual ~SyncBatchNormBase() = default;

  // The group statistics are synchronized over; null: none yet (behaves like BatchNorm).
  const ProcessGroupPtr& process_group() const { return process_group_; }

  // Sets the group explicitly: DistributedDataParallel then leaves it alone.
  void set_process_group(ProcessGroupPtr pg) {
    process_group_ = std::move(pg);
    explicit_group_ = true;
  }

  // DistributedDataParallel's hand-over: takes `pg` unless a group was set explicitly.
  // Returns whether it took it.
  bool adopt_process_group(ProcessGroupPtr pg) {
    if (explicit_group_) return false;
    process_group_ = std::move(pg);
    return true;
  }

 protected:
  // The batch-normalized input, with the layer's tensors and options (see the contract above).
  torch::Tensor sync_forward(const torch::Tensor& input, const torch::Tensor& weight,
                             const torch::Tensor& bias, const torch::Tensor& running_mean,
                             const torch::Tensor& running_var,
                             const torch::Tensor& num_batches_tracked,
                             const torch::nn::BatchNormOptions& options, bool training);

 private:
  ProcessGroupPtr process_group_;
  bool explicit_group_ = false;
};

namespace detail {
// Throws UsageError unless `input` has the ranks a SyncBatchNorm{D}d accepts.
void check_sync_batch_norm_input(size_t D, const torch::Tensor& input);
}  // namespace detail

template <size_t D, typename Derived>
class SyncBatchNormImplBase
    : public torch::nn::NormImplBase<D, Derived, torch::nn::BatchNormOptions>,
      public SyncBatchNormBase {
 public:
  using torch::nn::NormImplBase<D, Derived, torch::nn::BatchNormOptions>::NormImplBase;

  torch::Tensor forward(const torch::Tensor& input) {
    _check_input_dim(input);
    return sync_forward(input, this->weight, this->bias, this->running_mean, this->running_var,
                        this->num_batches_tracked, this->options, this->is_training());
  }

  void pretty_print(std::ostream& stream) const override {
    stream << "ddp::SyncBatchNorm" << D << "d(" << this->options.num_features() << ", "
           << "eps=" << this->options.eps() << ", momentum=";
    if (this->options.momentum().has_value()) {
      stream << *this->options.momentum();
    } else {
      stream << "None";
    }
    stream << ", affine=" << this->options.affine()
           << ", track_running_stats=" << this->options.track_running_stats() << ")";
  }

 protected:
  void _check_input_dim(const torch::Tensor& input) override {
    detail::check_sync_batch_norm_input(D, input);
  }
};

// Input (N, C) or (N, C, L).
class SyncBatchNorm1dImpl : public SyncBatchNormImplBase<1, SyncBatchNorm1dImpl> {
 public:
  using SyncBatchNormImplBase<1, SyncBatchNorm1dImpl>::SyncBatchNormImplBase;
};
// Input (N, C, H, W).
class SyncBatchNorm2dImpl : public SyncBatchNormImplBase<2, SyncBatchNorm2dImpl> {
 public:
  using SyncBatchNormImplBase<2, SyncBatchNorm2dImpl>::SyncBatchNormImplBase;
};
// Input (N, C, D, H, W).
class SyncBatchNorm3dImpl : public SyncBatchNormImplBase<3, SyncBatchNorm3dImpl> {
 public:
  using SyncBatchNormImplBase<3, SyncBatchNorm3dImpl>::SyncBatchNormImplBase;
};

TORCH_MODULE(SyncBatchNorm1d);
TORCH_MODULE(SyncBatchNorm2d);
TORCH_MODULE(SyncBatchNorm3d);

// Replaces every torch::nn::BatchNorm{1,2,3}d held by a container (Sequential, ModuleList,
// ModuleDict) anywhere inside `module` with the SyncBatchNorm of the same dimension: same
// options, training mode, and copies of weight, bias and running statistics (same device and
// dtype). With a non-null `pg` the new layers get it explicitly (set_process_group); otherwise
// DistributedDataParallel hands over its group. Returns how many layers it replaced.
//
// Call it before building the optimizer: the new layers have new parameter tensors.
//
// A BatchNorm that is a member of the user's own module (a holder field such as
// `torch::nn::BatchNorm2d bn;`) cannot be swapped from outside: the field would keep pointing at
// the old layer (C++ has no attribute assignment by name). Those are left in place, not counted,
// and named in a warning; declare them as ddp::SyncBatchNorm2d instead. `module` itself being a
// BatchNorm is a UsageError for the same reason.
int convert_sync_batchnorm(torch::nn::Module& module, ProcessGroupPtr pg = nullptr);

}  // namespace ddp
