#pragma once
// The element loop of FusedAdam: one pass over a float32 parameter, its gradient and its Adam
// moments. Free of LibTorch so it compiles with the flags that let the compiler vectorise it
// (-fno-math-errno for sqrt; see src/torch/CMakeLists.txt).
#include <cstdint>

namespace ddp::detail {

// The step's scalars, as torch::optim::Adam computes them (in double) before it converts
// them to the tensor's float type.
struct AdamScalars {
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float one_minus_beta1 = 0.1f;
  float one_minus_beta2 = 0.001f;
  float sqrt_bias_correction2 = 1;  // sqrt(1 - beta2^step)
  float step_size = 1e-3f;          // lr / (1 - beta1^step)
  float eps = 1e-8f;
  float weight_decay = 0;  // L2 penalty added to the gradient (not AdamW's decoupled decay)
};

// Updates elements [0, n) in place, in torch::optim::Adam's order of operations:
//   g = grad + weight_decay * param
//   exp_avg = exp_avg * beta1 + (1 - beta1) * g
//   exp_avg_sq = exp_avg_sq * beta2 + (1 - beta2) * g * g
//   max_exp_avg_sq = max(max_exp_avg_sq, exp_avg_sq)      (amsgrad: when it is not null)
//   param = param + -step_size * exp_avg / (sqrt(v) / sqrt_bias_correction2 + eps),
//     v = max_exp_avg_sq with amsgrad, else exp_avg_sq.
// The arrays must not overlap.
void adam_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                 float* max_exp_avg_sq, int64_t n, const AdamScalars& s);

}  // namespace ddp::detail
