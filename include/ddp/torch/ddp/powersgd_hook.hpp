#pragma once
// PowerSGD gradient compression (Vogels et al., https://arxiv.org/abs/1905.13727), the
// communication hook of PyTorch's
// torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook (PowerSGDState + powerSGD_hook),
// with the same options, state and arithmetic:
//
//   auto hook = ddp::powerSGD_hook(ddp::PowerSGDOptions().matrix_approximation_rank(2)
//                                      .start_powerSGD_iter(100));
//   ddp::DistributedDataParallel model(net, pg, DistributedDataParallelOptions().comm_hook(hook));
//
// Before iteration start_powerSGD_iter a bucket is averaged exactly (divided by the world size,
// then all-reduced). From then on, per bucket: the local error of the previous iteration is
// added (use_error_feedback); each member gradient is viewed as a matrix
// [shape[0], numel / shape[0]]; those where (n + m) * r * min_compression_rate < n * m
// (r = min(n, m, matrix_approximation_rank)) are compressed, the others (biases, small layers)
// are all-reduced as one flat tensor. A compressed M gets Q [m, r]: standard normal values
// drawn with a seed from the hook's random generator and orthogonalized (or, with warm_start,
// the previous iteration's Q orthogonalized again); P = M Q is all-reduced, orthogonalized,
// Q = M^T P is all-reduced and divided by the world size, and M is replaced by P Q^T. The
// error left (input minus result) is kept for the next iteration.
//
// Reproducibility against PyTorch: the seeds come from an MT19937 seeded with random_seed and
// drawn like numpy's RandomState(random_seed).randint(1_000_000_000); each seeds a fresh CPU
// generator for torch::randn, as Python's torch.manual_seed inside fork_rng does (the global
// generator is not touched). Given the same gradients the hook therefore produces PyTorch's
// numbers, including the initial Qs (tests/torch/ddp/test_powersgd.cpp checks this against
// Python at test time).
//
// Iterations are counted as PyTorch does: one per launch of the last bucket
// (BucketInfo::is_last). Matrices are grouped by shape in order of first appearance within a
// bucket (PyTorch's order of Ps and Qs); batch_tensors_with_same_shape is not implemented.
//
// Communication per bucket and iteration: up to three all-reduces (the uncompressed tensors,
// the Ps, the Qs). The first two start in launch(); the Q stage runs in finish(), which DDP
// calls for every bucket in index order at the end of backward, so every rank issues the
// collectives in the same order. is_completed() is false until finish() has run.
//
// One hook object keeps the state of one model (per bucket index: error, P, Q); do not share
// it between DDP instances. It must outlive its reductions (DDP keeps it in its options).

#include <torch/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>

#include <torch/arg.h>

#include "ddp/torch/ddp/comm_hooks.hpp"

namespace ddp {

// Names and defaults as Python's PowerSGDState.
struct PowerSGDOptions {
  // Rank r of the low-rank approximation: lower compresses more. 1-4 is typical.
  TORCH_ARG(int64_t, matrix_approximation_rank) = 1;
  // Iterations of exact all-reduce before compression starts (at least 2 with error feedback
  // or warm start: DDP rebuilds its buckets after the first iteration).
  TORCH_ARG(int64_t, start_powerSGD_iter) = 1000;
  // A matrix is compressed only when that saves more than this factor of its elements.
  TORCH_ARG(double, min_compression_rate) = 2.0;
  // Add the previous iteration's compression error to the gradient before compressing.
  TORCH_ARG(bool, use_error_feedback) = true;
  // Start from the previous iteration's Q instead of new random values.
  TORCH_ARG(bool, warm_start) = true;
  // Added to the column norms when orthogonalizing (avoids dividing by zero for all-zero
  // gradients, e.g. 1e-8); 0 as PyTorch's default.
  TORCH_ARG(double, orthogonalization_epsilon) = 0.0;
  // Seed of the generator that seeds the random Qs (the same on every rank).
  TORCH_ARG(uint32_t, random_seed) = 0;
};

// As PowerSGDState.compression_stats(): elements before and after compression summed over the
// buckets and iterations compressed so far, and their ratio (0 before any).
struct PowerSGDCompressionStats {
  double compress_rate = 0;
  int64_t numel_before_compression = 0;
  int64_t numel_after_compression = 0;
};

class PowerSGDHook : public CommHook {
 public:
  // Throws UsageError for a rank < 1, or start_powerSGD_iter < 2 with error feedback or warm
  // start (as PowerSGDState's ValueError).
  explicit PowerSGDHook(PowerSGDOptions options = {});
  std::string name() const override { return "powerSGD"; }
  std::unique_ptr<BucketReduction> launch(ProcessGroup& pg, const torch::Tensor& bucket,
                                          const BucketInfo& info) override;

  const PowerSGDOptions& options() const { return options_; }
  // PowerSGDState.iter: iterations seen so far.
  int64_t iteration() const;
  PowerSGDCompressionStats compression_stats() const;

 private:
  friend class PowerSGDReduction;
  // The next seed for torch's generator: numpy's RandomState.randint(1_000_000_000).
  uint64_t next_seed_locked();
  void count_iteration_locked(const BucketInfo& info);

  PowerSGDOptions options_;
  mutable std::mutex mutex_;
  std::mt19937 rng_;
  int64_t iter_ = 0;
  int64_t numel_before_ = 0;
  int64_t numel_after_ = 0;
  // Per bucket index.
  std::map<size_t, torch::Tensor> error_;
  std::map<size_t, torch::Tensor> p_memory_;
  std::map<size_t, torch::Tensor> q_memory_;
};

std::shared_ptr<PowerSGDHook> powerSGD_hook(PowerSGDOptions options = {});

}  // namespace ddp
