#include "ddp/torch/optim/fused_adam.hpp"

#include <ATen/Parallel.h>
#include <c10/util/string_utils.h>

#include <cmath>

#include "adam_kernel.hpp"
#include "ddp/torch/optim/optimizer_state_key.hpp"

namespace ddp {

namespace {

using torch::optim::AdamOptions;
using torch::optim::AdamParamState;

// Elements per task when a parameter is split over intra-op threads: large enough that a
// task's overhead is lost in its memory traffic (7 arrays x 4 bytes x 64 Ki = 1.8 MB).
constexpr int64_t kGrain = 64 * 1024;

// What the kernel reads: a contiguous dense float32 CPU tensor shaped like the parameter.
bool kernel_layout(const torch::Tensor& t, const torch::Tensor& param) {
  return t.defined() && t.layout() == torch::kStrided && t.device().is_cpu() &&
         t.scalar_type() == torch::kFloat32 && t.is_contiguous() && t.sizes() == param.sizes();
}

bool fusable(const torch::Tensor& param, const torch::Tensor& grad, const AdamParamState& state,
             bool amsgrad) {
  return kernel_layout(param, param) && kernel_layout(grad, param) &&
         kernel_layout(state.exp_avg(), param) && kernel_layout(state.exp_avg_sq(), param) &&
         (!amsgrad || kernel_layout(state.max_exp_avg_sq(), param));
}

// torch::optim::Adam's update as tensor operations, for parameters the kernel does not take.
void unfused_update(torch::Tensor& param, torch::Tensor grad, AdamParamState& state,
                    const AdamOptions& options, double bias_correction1, double bias_correction2) {
  const auto [beta1, beta2] = options.betas();
  if (options.weight_decay() != 0) grad = grad.add(param, options.weight_decay());
  state.exp_avg().mul_(beta1).add_(grad, 1 - beta1);
  state.exp_avg_sq().mul_(beta2).addcmul_(grad, grad.conj(), 1 - beta2);
  torch::Tensor v = state.exp_avg_sq();
  if (options.amsgrad()) {
    torch::max_out(state.max_exp_avg_sq(), state.exp_avg_sq(), state.max_exp_avg_sq());
    v = state.max_exp_avg_sq();
  }
  const auto denom = (v.sqrt() / std::sqrt(bias_correction2)).add_(options.eps());
  param.addcdiv_(state.exp_avg(), denom, -options.lr() / bias_correction1);
}

void fused_update(torch::Tensor& param, const torch::Tensor& grad, AdamParamState& state,
                  const AdamOptions& options, double bias_correction1, double bias_correction2) {
  const auto [beta1, beta2] = options.betas();
  detail::AdamScalars s;
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta1 = static_cast<float>(1 - beta1);
  s.one_minus_beta2 = static_cast<float>(1 - beta2);
  s.sqrt_bias_correction2 = static_cast<float>(std::sqrt(bias_correction2));
  s.step_size = static_cast<float>(options.lr() / bias_correction1);
  s.eps = static_cast<float>(options.eps());
  s.weight_decay = static_cast<float>(options.weight_decay());
  float* p = param.data_ptr<float>();
  const float* g = grad.data_ptr<float>();
  float* m = state.exp_avg().data_ptr<float>();
  float* v = state.exp_avg_sq().data_ptr<float>();
  float* vmax = options.amsgrad() ? state.max_exp_avg_sq().data_ptr<float>() : nullptr;
  at::parallel_for(0, param.numel(), kGrain, [&](int64_t begin, int64_t end) {
    detail::adam_update(p + begin, g + begin, m + begin, v + begin, vmax ? vmax + begin : nullptr,
                        end - begin, s);
  });
}

}  // namespace

torch::Tensor FusedAdam::step(LossClosure closure) {
  torch::NoGradGuard no_grad;
  torch::Tensor loss;
  if (closure) {
    at::AutoGradMode enable_grad(true);
    loss = closure();
  }
  last_step_paths_ = {};
  for (auto& group : param_groups_) {
    const auto& options = static_cast<const AdamOptions&>(group.options());
    for (auto& param : group.params()) {
      if (!param.grad().defined()) continue;
      const torch::Tensor& grad = param.grad();
      TORCH_CHECK(!grad.is_sparse(),
                  "FusedAdam does not support sparse gradients (nor does torch::optim::Adam); "
                  "use SparseAdam");
      // The key and the state's layout are torch::optim::Adam's, so saved states interchange.
      const OptimizerStateKey key = optimizer_state_key(param);
      auto it = state_.find(key);
      if (it == state_.end()) {
        auto fresh = std::make_unique<AdamParamState>();
        fresh->exp_avg(torch::zeros_like(param, torch::MemoryFormat::Preserve));
        fresh->exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Preserve));
        if (options.amsgrad()) {
          fresh->max_exp_avg_sq(torch::zeros_like(param, torch::MemoryFormat::Preserve));
        }
        it = state_.emplace(key, std::move(fresh)).first;
      }
      auto& state = static_cast<AdamParamState&>(*it->second);
      state.step(state.step() + 1);
      const double bias_correction1 =
          1 - std::pow(std::get<0>(options.betas()), static_cast<double>(state.step()));
      const double bias_correction2 =
          1 - std::pow(std::get<1>(options.betas()), static_cast<double>(state.step()));
      if (fusable(param, grad, state, options.amsgrad())) {
        fused_update(param, grad, state, options, bias_correction1, bias_correction2);
        ++last_step_paths_.fused;
      } else {
        unfused_update(param, grad, state, options, bias_correction1, bias_correction2);
        ++last_step_paths_.unfused;
      }
    }
  }
  return loss;
}

}  // namespace ddp
