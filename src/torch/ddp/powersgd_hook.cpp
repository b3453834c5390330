#include "ddp/torch/ddp/powersgd_hook.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"

namespace ddp {
namespace {

// Python's _orthogonalize_gram_schmidt on a batch of matrices [b, n, r], in place, with the
// same tensor operations in the same order (torch.norm(col, dim=1, keepdim=True) is
// frobenius_norm over dim 1 in torch 1.13). With epsilon 0 an all-zero column gives NaNs, as
// in PyTorch (orthogonalization_epsilon exists for that).
void gram_schmidt(const torch::Tensor& matrices, double epsilon) {
  const int64_t cols = matrices.size(2);
  for (int64_t i = 0; i < cols; ++i) {
    torch::Tensor col = matrices.narrow(2, i, 1);
    torch::Tensor norm = torch::frobenius_norm(col, {1}, /*keepdim=*/true);
    if (epsilon == 0) {
      col.div_(norm);
    } else {
      col.div_(norm + epsilon);
    }
    if (i + 1 < cols) {
      torch::Tensor rest = matrices.narrow(2, i + 1, cols - i - 1);
      rest.sub_(torch::sum(col * rest, {1}, /*keepdim=*/true) * col);
    }
  }
}

// Python's _orthogonalize: Gram-Schmidt for rank <= 2 and half types, else reduced QR.
void orthogonalize(const torch::Tensor& matrices, double epsilon) {
  const auto type = matrices.scalar_type();
  if (matrices.size(2) <= 2 || type == torch::kHalf || type == torch::kBFloat16) {
    gram_schmidt(matrices, epsilon);
  } else {
    matrices.copy_(std::get<0>(torch::linalg_qr(matrices)));
  }
}

}  // namespace

// One bucket's reduction. Exact (before start_powerSGD_iter): `plain` set, one all-reduce of
// `work` (the bucket pre-divided by the world size). Compressed: the uncompressed tensors'
// and the Ps' all-reduces were started by launch(); finish() runs the rest of PowerSGD.
class PowerSGDReduction : public BucketReduction {
 public:
  PowerSGDReduction(PowerSGDHook& hook, ProcessGroup& pg, torch::Tensor bucket,
                    torch::Tensor work_buffer, BucketInfo info)
      : hook_(hook),
        pg_(pg),
        bucket_(std::move(bucket)),
        buf_(std::move(work_buffer)),
        info_(std::move(info)) {}

  bool is_completed() override { return finished_; }

  void finish(std::chrono::milliseconds timeout) override {
    if (finished_) return;
    torch::NoGradGuard no_grad;
    const double world = pg_.size();
    if (plain) {
      wait_on_current_stream(pg_, *plain, timeout);
    } else {
      if (uncompressed_work) {
        wait_on_current_stream(pg_, *uncompressed_work, timeout);
        uncompressed_memory.div_(world);
        int64_t at = 0;
        for (auto& t : uncompressed) {
          t.copy_(uncompressed_memory.narrow(0, at, t.numel()).view_as(t));
          at += t.numel();
        }
      }
      if (p_work) wait_on_current_stream(pg_, *p_work, timeout);
      const double epsilon = hook_.options_.orthogonalization_epsilon();
      for (auto& p : ps) orthogonalize(p, epsilon);
      for (size_t k = 0; k < matrices.size(); ++k) {
        torch::bmm_out(qs[k], matrices[k].transpose(1, 2), ps[k]);
      }
      if (q_memory.numel() > 0) {
        WorkPtr q_work = all_reduce(pg_, q_memory, ReduceOp::kSum);
        wait_on_current_stream(pg_, *q_work, timeout);
      }
      q_memory.div_(world);
      for (size_t k = 0; k < matrices.size(); ++k) {
        torch::bmm_out(matrices[k], ps[k], qs[k].transpose(1, 2));
      }
    }
    {
      std::lock_guard<std::mutex> lock(hook_.mutex_);
      if (!plain) {
        if (input_copy.defined()) hook_.error_[info_.index] = input_copy - buf_;
        if (!hook_.options_.warm_start()) {
          hook_.p_memory_.clear();
          hook_.q_memory_.clear();
        }
        hook_.count_iteration_locked(info_);
      }
    }
    if (!buf_.is_same(bucket_)) bucket_.copy_(buf_);
    finished_ = true;
  }

  WorkPtr plain;
  torch::Tensor input_copy;  // with error feedback: the input after adding the old error
  std::vector<torch::Tensor> uncompressed;
  torch::Tensor uncompressed_memory;
  WorkPtr uncompressed_work;
  std::vector<torch::Tensor> matrices;  // [1, n, m] views into the buffer, in P/Q order
  std::vector<torch::Tensor> ps, qs;    // [1, n, r] / [1, m, r] views of the memories
  torch::Tensor p_memory, q_memory;
  WorkPtr p_work;

 private:
  PowerSGDHook& hook_;  // outlives the reduction (DDP holds the hook)
  ProcessGroup& pg_;
  torch::Tensor bucket_;
  torch::Tensor buf_;  // the bucket, or its host copy when the backend cannot address it
  BucketInfo info_;
  bool finished_ = false;
};

PowerSGDHook::PowerSGDHook(PowerSGDOptions options)
    : options_(std::move(options)), rng_(options_.random_seed()) {
  if (options_.matrix_approximation_rank() < 1) {
    throw UsageError(
        fmt::format("PowerSGDOptions::matrix_approximation_rank must be at least 1, "
                    "got {}",
                    options_.matrix_approximation_rank()));
  }
  if ((options_.use_error_feedback() || options_.warm_start()) &&
      options_.start_powerSGD_iter() <= 1) {
    throw UsageError(fmt::format(
        "PowerSGDOptions::start_powerSGD_iter must be greater than 1 with use_error_feedback or "
        "warm_start (got {}): DDP rebuilds its buckets after the first iteration, which would "
        "invalidate the error and Q kept per bucket; use 2 or more, or turn both off",
        options_.start_powerSGD_iter()));
  }
}

int64_t PowerSGDHook::iteration() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return iter_;
}

PowerSGDCompressionStats PowerSGDHook::compression_stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  PowerSGDCompressionStats stats;
  stats.numel_before_compression = numel_before_;
  stats.numel_after_compression = numel_after_;
  if (numel_after_ > 0) stats.compress_rate = static_cast<double>(numel_before_) / numel_after_;
  return stats;
}

uint64_t PowerSGDHook::next_seed_locked() {
  // numpy's legacy RandomState.randint(0, 1e9): 32-bit MT19937 outputs masked to 30 bits,
  // rejected until they fall below the bound. std::mt19937 seeded with an integer is numpy's
  // init_genrand.
  constexpr uint32_t kBound = 1000000000u - 1;
  constexpr uint32_t kMask = (1u << 30) - 1;
  uint32_t value;
  do {
    value = static_cast<uint32_t>(rng_()) & kMask;
  } while (value > kBound);
  return value;
}

void PowerSGDHook::count_iteration_locked(const BucketInfo& info) {
  if (!info.is_last()) return;
  ++iter_;
  if (iter_ == options_.start_powerSGD_iter()) {
    log::get("ddp.ddp")->info("PowerSGD: compression starts after {} iterations", iter_);
  }
}

std::unique_ptr<BucketReduction> PowerSGDHook::launch(ProcessGroup& pg, const torch::Tensor& bucket,
                                                      const BucketInfo& info) {
  if (info.offsets.size() != info.shapes.size()) {
    throw UsageError(fmt::format("PowerSGD: bucket {} has {} offsets but {} shapes", info.index,
                                 info.offsets.size(), info.shapes.size()));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  torch::NoGradGuard no_grad;
  const torch::Tensor buf = needs_host_staging(bucket, pg) ? pinned_host_copy(bucket) : bucket;
  auto reduction = std::make_unique<PowerSGDReduction>(*this, pg, bucket, buf, info);
  const double world = pg.size();

  if (iter_ < options_.start_powerSGD_iter()) {
    count_iteration_locked(info);
    buf.div_(world);
    reduction->plain = all_reduce(pg, buf, ReduceOp::kSum);
    return reduction;
  }

  const size_t index = info.index;
  const int64_t total = buf.numel();
  const auto options = buf.options();
  if (options_.use_error_feedback()) {
    auto found = error_.find(index);
    if (found == error_.end()) {
      error_[index] = torch::zeros({total}, options);
    } else {
      if (found->second.numel() != total) {
        throw UsageError(fmt::format(
            "PowerSGD: bucket {} holds {} elements but held {} in the previous iteration; one "
            "hook keeps the state of one model and its bucket layout must not change once "
            "compression has started",
            index, total, found->second.numel()));
      }
      buf.add_(found->second);
    }
    reduction->input_copy = buf.clone();
  }

  // Which gradients are worth compressing, grouped by matrix shape in order of first
  // appearance (PyTorch's shape_to_tensors dict: the order of the Ps and Qs in memory).
  const int64_t rank_cap = options_.matrix_approximation_rank();
  std::vector<std::pair<std::pair<int64_t, int64_t>, std::vector<torch::Tensor>>> groups;
  int64_t ps_size = 0;
  int64_t qs_size = 0;
  for (torch::Tensor t : info.gradients(buf)) {
    if (t.dim() == 0) {  // a scalar parameter: nothing to factor
      reduction->uncompressed.push_back(t);
      numel_before_ += 1;
      numel_after_ += 1;
      continue;
    }
    torch::Tensor matrix = t.view({t.size(0), -1});
    const int64_t n = matrix.size(0);
    const int64_t m = matrix.size(1);
    const int64_t r = std::min({n, m, rank_cap});
    const int64_t uncompressed_size = n * m;
    const int64_t compressed_size = (n + m) * r;
    numel_before_ += uncompressed_size;
    if (static_cast<double>(compressed_size) * options_.min_compression_rate() <
        static_cast<double>(uncompressed_size)) {
      auto key = std::make_pair(n, m);
      auto group =
          std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == key; });
      if (group == groups.end()) {
        groups.push_back({key, {}});
        group = std::prev(groups.end());
      }
      group->second.push_back(matrix);
      ps_size += n * r;
      qs_size += m * r;
      numel_after_ += compressed_size;
    } else {
      reduction->uncompressed.push_back(t);
      numel_after_ += uncompressed_size;
    }
  }

  if (!reduction->uncompressed.empty()) {
    std::vector<torch::Tensor> flat;
    for (const auto& t : reduction->uncompressed) flat.push_back(t.reshape({-1}));
    reduction->uncompressed_memory = torch::cat(flat);
  } else {
    reduction->uncompressed_memory = torch::empty({0}, options);
  }

  const bool randomize = !options_.warm_start() || !p_memory_.count(index);
  if (randomize) {
    p_memory_[index] = torch::empty({ps_size}, options);
    q_memory_[index] = torch::empty({qs_size}, options);
  } else if (p_memory_[index].numel() != ps_size || q_memory_[index].numel() != qs_size) {
    throw UsageError(fmt::format(
        "PowerSGD: bucket {}'s compressed matrices changed shape since the previous iteration "
        "(P {} -> {} elements); its bucket layout must not change once compression has started",
        index, p_memory_[index].numel(), ps_size));
  }
  reduction->p_memory = p_memory_[index];
  reduction->q_memory = q_memory_[index];

  int64_t p_at = 0;
  int64_t q_at = 0;
  for (const auto& group : groups) {
    for (const auto& matrix : group.second) {
      const int64_t n = matrix.size(0);
      const int64_t m = matrix.size(1);
      const int64_t r = std::min({n, m, rank_cap});
      reduction->matrices.push_back(matrix.unsqueeze(0));
      reduction->ps.push_back(reduction->p_memory.narrow(0, p_at, n * r).view({1, n, r}));
      reduction->qs.push_back(reduction->q_memory.narrow(0, q_at, m * r).view({1, m, r}));
      p_at += n * r;
      q_at += m * r;
    }
  }

  const double epsilon = options_.orthogonalization_epsilon();
  if (!randomize) {
    for (auto& q : reduction->qs) orthogonalize(q, epsilon);
  } else {
    // Drawn even when nothing in this bucket is compressed, as PyTorch does, so the seeds of
    // later buckets and iterations stay in step with it.
    auto generator = at::detail::createCPUGenerator(next_seed_locked());
    for (auto& q : reduction->qs) {
      q.copy_(torch::randn(q.sizes(), generator, torch::TensorOptions().dtype(buf.dtype())));
      orthogonalize(q, epsilon);
    }
  }
  for (size_t k = 0; k < reduction->matrices.size(); ++k) {
    torch::bmm_out(reduction->ps[k], reduction->matrices[k], reduction->qs[k]);
  }
  // Every rank has the same layout, so all skip the same empty collectives.
  if (reduction->uncompressed_memory.numel() > 0) {
    reduction->uncompressed_work = all_reduce(pg, reduction->uncompressed_memory, ReduceOp::kSum);
  }
  if (reduction->p_memory.numel() > 0) {
    reduction->p_work = all_reduce(pg, reduction->p_memory, ReduceOp::kSum);
  }
  return reduction;
}

std::shared_ptr<PowerSGDHook> powerSGD_hook(PowerSGDOptions options) {
  return std::make_shared<PowerSGDHook>(std::move(options));
}

}  // namespace ddp
