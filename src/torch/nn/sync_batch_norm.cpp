#include "ddp/torch/nn/sync_batch_norm.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/spdlog.h>

#include <string>
#include <vector>

#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/torch/ddp/tensor_adapter.hpp"
#include "ddp/util/error.hpp"

namespace ddp {

namespace {

// Every dimension but the channel dimension (1): the ones statistics reduce over.
std::vector<int64_t> reduction_dims(const torch::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// The shape that broadcasts a per-channel vector against `input`: (1, C, 1, ...).
std::vector<int64_t> channel_shape(const torch::Tensor& input) {
  std::vector<int64_t> shape(static_cast<size_t>(input.dim()), 1);
  shape[1] = input.size(1);
  return shape;
}

// In-place sum over the group, waited for. CUDA tensors on a host backend go through a host
// copy (the comm layer cannot address device memory).
void all_reduce_sum(ProcessGroup& pg, torch::Tensor& buffer) {
  if (needs_host_staging(buffer, pg)) {
    auto host = pinned_host_copy(buffer);
    ddp::all_reduce(pg, host)->wait(pg.timeout());
    buffer.copy_(host);
    return;
  }
  auto work = ddp::all_reduce(pg, buffer);
  wait_on_current_stream(pg, *work, pg.timeout());
}

// Holds the group in the autograd context (saved_data holds IValues only).
struct GroupCapsule : torch::CustomClassHolder {
  explicit GroupCapsule(ProcessGroupPtr p) : pg(std::move(p)) {}
  ProcessGroupPtr pg;
};

// y = (x - mean) * invstd * weight + bias with mean and invstd the group's statistics, given;
// backward differentiates through them (all-reduce of sum(dy), sum(dy * (x - mean))).
// An absent weight or bias (affine(false)) comes as an empty tensor: autograd Functions take
// no undefined inputs.
struct SyncBatchNormFunction : torch::autograd::Function<SyncBatchNormFunction> {
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx, const torch::Tensor& input,
                               const torch::Tensor& weight, const torch::Tensor& bias,
                               const torch::Tensor& mean, const torch::Tensor& invstd, double count,
                               const ProcessGroupPtr& pg) {
    // scale and shift per channel in float64, as torch's CPU kernel folds them (alpha, beta).
    auto scale = invstd;
    if (weight.numel() > 0) scale = scale * weight.to(torch::kDouble);
    auto shift = -mean * scale;
    if (bias.numel() > 0) shift = shift + bias.to(torch::kDouble);
    const auto shape = channel_shape(input);
    auto output = input * scale.to(input.scalar_type()).view(shape) +
                  shift.to(input.scalar_type()).view(shape);
    ctx->save_for_backward({input, weight, mean, invstd});
    ctx->saved_data["count"] = count;
    ctx->saved_data["has_bias"] = bias.numel() > 0;
    ctx->saved_data["pg"] = c10::IValue::make_capsule(c10::make_intrusive<GroupCapsule>(pg));
    return output;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& input = saved[0];
    const auto& weight = saved[1];
    const auto& mean = saved[2];                               // float64, (C)
    const auto& invstd = saved[3];                             // float64, (C)
    const double count = ctx->saved_data["count"].toDouble();  // global, > 1
    auto capsule = ctx->saved_data["pg"].toCapsule();
    ProcessGroup& pg = *static_cast<GroupCapsule*>(capsule.get())->pg;

    torch::autograd::variable_list out(7);
    const auto& dy = grads[0];
    const bool need_input = ctx->needs_input_grad(0);
    if (!dy.defined()) {
      // Nothing flows back; the other ranks still expect this rank's share of the sums.
      if (need_input) {
        auto sums = torch::zeros({2 * input.size(1)}, input.options().dtype(torch::kDouble));
        all_reduce_sum(pg, sums);
      }
      return out;
    }
    const auto dims = reduction_dims(input);
    const auto shape = channel_shape(input);
    const auto dtype = input.scalar_type();
    auto xmu = input - mean.to(dtype).view(shape);
    auto sum_dy = dy.sum(dims, /*keepdim=*/false, torch::kDouble);
    auto sum_dy_xmu = (dy * xmu).sum(dims, /*keepdim=*/false, torch::kDouble);
    // weight and bias gradients are this rank's (DDP averages them over ranks).
    if (weight.numel() > 0 && ctx->needs_input_grad(1)) {
      out[1] = (sum_dy_xmu * invstd).to(weight.scalar_type());
    }
    if (ctx->needs_input_grad(2) && ctx->saved_data["has_bias"].toBool()) out[2] = sum_dy.to(dtype);
    if (need_input) {
      auto sums = torch::cat({sum_dy, sum_dy_xmu});
      all_reduce_sum(pg, sums);
      const int64_t C = input.size(1);
      auto mean_dy = sums.narrow(0, 0, C) / count;
      auto mean_dy_xmu = sums.narrow(0, C, C) / count;
      auto gain = weight.numel() > 0 ? invstd * weight.to(torch::kDouble) : invstd;
      auto k = invstd * invstd * mean_dy_xmu;
      out[0] = (dy - mean_dy.to(dtype).view(shape) - xmu * k.to(dtype).view(shape)) *
               gain.to(dtype).view(shape);
    }
    return out;
  }
};

}  // namespace

namespace detail {

void check_sync_batch_norm_input(size_t D, const torch::Tensor& input) {
  const int64_t dim = input.dim();
  const bool ok = D == 1 ? (dim == 2 || dim == 3) : dim == static_cast<int64_t>(D) + 2;
  if (ok) return;
  const std::string expected = D == 1 ? "2D or 3D" : fmt::format("{}D", D + 2);
  throw UsageError(fmt::format("SyncBatchNorm{}d: expected {} input, got {}D input (sizes {})", D,
                               expected, dim, c10::str(input.sizes())));
}

}  // namespace detail

torch::Tensor SyncBatchNormBase::sync_forward(
    const torch::Tensor& input, const torch::Tensor& weight, const torch::Tensor& bias,
    const torch::Tensor& running_mean, const torch::Tensor& running_var,
    const torch::Tensor& num_batches_tracked, const torch::nn::BatchNormOptions& options,
    bool training) {
  // The running average's factor, exactly as torch::nn::BatchNormImplBase::forward.
  double factor = options.momentum().value_or(0.0);
  if (training && options.track_running_stats() && num_batches_tracked.defined()) {
    num_batches_tracked.add_(1);
    factor = options.momentum().has_value() ? *options.momentum()
                                            : 1.0 / num_batches_tracked.item<double>();
  }
  if (!training || !process_group_ || process_group_->size() <= 1) {
    return torch::nn::functional::detail::batch_norm(input, running_mean, running_var, weight, bias,
                                                     training || !options.track_running_stats(),
                                                     factor, options.eps());
  }

  ProcessGroup& pg = *process_group_;
  const int64_t C = input.size(1);
  if (C != options.num_features()) {
    throw UsageError(fmt::format("SyncBatchNorm: input has {} channels (sizes {}), the layer {}", C,
                                 c10::str(input.sizes()), options.num_features()));
  }
  torch::Tensor mean, invstd;
  double count = 0;
  {
    torch::NoGradGuard no_grad;
    const auto dims = reduction_dims(input);
    const auto x = input.detach();
    // [sum (C), sum of squares (C), count]: one collective, accumulated in float64.
    auto stats =
        torch::cat({x.sum(dims, false, torch::kDouble), x.square().sum(dims, false, torch::kDouble),
                    torch::full({1}, C > 0 ? static_cast<double>(x.numel() / C) : 0.0,
                                x.options().dtype(torch::kDouble))});
    all_reduce_sum(pg, stats);
    count = stats[2 * C].item<double>();
    if (count <= 1) {
      throw UsageError(fmt::format(
          "SyncBatchNorm: expected more than 1 value per channel when training, got {} over {} "
          "ranks (this rank's input sizes {})",
          count, pg.size(), c10::str(input.sizes())));
    }
    mean = stats.narrow(0, 0, C) / count;
    auto var = (stats.narrow(0, C, C) / count - mean * mean).clamp_min(0);
    invstd = (var + options.eps()).rsqrt();
    if (running_mean.defined()) {
      running_mean.mul_(1 - factor).add_(mean.to(running_mean.scalar_type()), factor);
      running_var.mul_(1 - factor)
          .add_((var * (count / (count - 1))).to(running_var.scalar_type()), factor);
    }
  }
  const auto absent = torch::empty({0}, input.options());
  return SyncBatchNormFunction::apply(input, weight.defined() ? weight : absent,
                                      bias.defined() ? bias : absent, mean, invstd, count,
                                      process_group_);
}

namespace {

template <typename SyncImpl, typename BatchNormImpl>
std::shared_ptr<SyncImpl> make_sync(const BatchNormImpl& bn, const ProcessGroupPtr& pg) {
  auto sync = std::make_shared<SyncImpl>(bn.options);
  torch::NoGradGuard no_grad;
  auto copy = [](torch::Tensor& to, const torch::Tensor& from) {
    if (!from.defined()) return;
    const bool requires_grad = from.requires_grad();
    to.set_data(from.detach().clone());
    if (to.is_leaf() && to.requires_grad() != requires_grad) to.set_requires_grad(requires_grad);
  };
  copy(sync->weight, bn.weight);
  copy(sync->bias, bn.bias);
  copy(sync->running_mean, bn.running_mean);
  copy(sync->running_var, bn.running_var);
  copy(sync->num_batches_tracked, bn.num_batches_tracked);
  sync->train(bn.is_training());
  if (pg) sync->set_process_group(pg);
  return sync;
}

// Puts `sync` in place of the child `name` (position `index`) of `parent`; false when
// `parent` is not a container whose elements can be swapped.
template <typename SyncImpl>
bool swap_child(torch::nn::Module& parent, const std::string& name, size_t index,
                const std::shared_ptr<SyncImpl>& sync) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&parent)) {
    // Sequential runs its AnyModule list; children_ feeds parameters() and named_modules().
    *(seq->begin() + static_cast<std::ptrdiff_t>(index)) = torch::nn::AnyModule(sync);
    parent.replace_module(name, sync);
    return true;
  }
  if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&parent)) {
    *(list->begin() + static_cast<std::ptrdiff_t>(index)) = sync;
    parent.replace_module(name, sync);
    return true;
  }
  if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&parent)) {
    // update() replaces an existing key in place (its insert() is private).
    dict->update(
        std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>>{{name, sync}});
    return true;
  }
  return false;
}

template <typename SyncImpl, typename BatchNormImpl>
bool try_convert(torch::nn::Module& parent, const std::string& name, size_t index,
                 torch::nn::Module& child, const ProcessGroupPtr& pg, bool& is_batch_norm) {
  auto* bn = dynamic_cast<BatchNormImpl*>(&child);
  if (!bn) return false;
  is_batch_norm = true;
  // Built only when the parent can take it: its constructor allocates.
  if (!dynamic_cast<torch::nn::SequentialImpl*>(&parent) &&
      !dynamic_cast<torch::nn::ModuleListImpl*>(&parent) &&
      !dynamic_cast<torch::nn::ModuleDictImpl*>(&parent)) {
    return false;
  }
  return swap_child(parent, name, index, make_sync<SyncImpl>(*bn, pg));
}

void convert_children(torch::nn::Module& parent, const std::string& path, const ProcessGroupPtr& pg,
                      int& replaced, std::vector<std::string>& left) {
  size_t index = 0;
  for (const auto& item : parent.named_children()) {
    const std::string& name = item.key();
    torch::nn::Module& child = *item.value();
    const std::string child_path = path.empty() ? name : path + "." + name;
    bool is_bn = false;
    const bool done = try_convert<SyncBatchNorm1dImpl, torch::nn::BatchNorm1dImpl>(
                          parent, name, index, child, pg, is_bn) ||
                      try_convert<SyncBatchNorm2dImpl, torch::nn::BatchNorm2dImpl>(
                          parent, name, index, child, pg, is_bn) ||
                      try_convert<SyncBatchNorm3dImpl, torch::nn::BatchNorm3dImpl>(
                          parent, name, index, child, pg, is_bn);
    if (done) {
      ++replaced;
    } else if (is_bn) {
      left.push_back(child_path);
    } else {
      convert_children(child, child_path, pg, replaced, left);
    }
    ++index;
  }
}

}  // namespace

int convert_sync_batchnorm(torch::nn::Module& module, ProcessGroupPtr pg) {
  if (dynamic_cast<torch::nn::BatchNorm1dImpl*>(&module) ||
      dynamic_cast<torch::nn::BatchNorm2dImpl*>(&module) ||
      dynamic_cast<torch::nn::BatchNorm3dImpl*>(&module)) {
    throw UsageError(
        "convert_sync_batchnorm: the module itself is a BatchNorm, which cannot be replaced in "
        "place from C++; construct a ddp::SyncBatchNorm{1,2,3}d instead");
  }
  int replaced = 0;
  std::vector<std::string> left;
  convert_children(module, "", pg, replaced, left);
  if (!left.empty()) {
    spdlog::warn(
        "convert_sync_batchnorm: left {} BatchNorm layer(s) in place: {} (members of a "
        "user-defined module cannot be swapped from outside in C++; declare them as "
        "ddp::SyncBatchNorm{{1,2,3}}d)",
        left.size(), fmt::format("{}", fmt::join(left, ", ")));
  }
  return replaced;
}

}  // namespace ddp
