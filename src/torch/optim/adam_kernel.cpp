#include "adam_kernel.hpp"

#include <cmath>

namespace ddp::detail {

namespace {

// One loop per variant, without branches inside, so the compiler vectorises each.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// An AVX2 clone beside the baseline one, picked at load time. No FMA: each product is rounded
// before its sum, as in LibTorch's separate mul_/add_/addcmul_/addcdiv_ kernels.
#define DDP_ADAM_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DDP_ADAM_CLONES
#endif

DDP_ADAM_CLONES
void update_plain(float* __restrict p, const float* __restrict g, float* __restrict m,
                  float* __restrict v, int64_t n, AdamScalars s) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = s.weight_decay != 0 ? g[i] + s.weight_decay * p[i] : g[i];
    const float mi = m[i] * s.beta1 + s.one_minus_beta1 * gi;
    const float vi = v[i] * s.beta2 + s.one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] + -s.step_size * mi / (std::sqrt(vi) / s.sqrt_bias_correction2 + s.eps);
  }
}

DDP_ADAM_CLONES
void update_amsgrad(float* __restrict p, const float* __restrict g, float* __restrict m,
                    float* __restrict v, float* __restrict vmax, int64_t n, AdamScalars s) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = s.weight_decay != 0 ? g[i] + s.weight_decay * p[i] : g[i];
    const float mi = m[i] * s.beta1 + s.one_minus_beta1 * gi;
    const float vi = v[i] * s.beta2 + s.one_minus_beta2 * gi * gi;
    const float vmaxi = vmax[i] < vi ? vi : vmax[i];
    m[i] = mi;
    v[i] = vi;
    vmax[i] = vmaxi;
    p[i] = p[i] + -s.step_size * mi / (std::sqrt(vmaxi) / s.sqrt_bias_correction2 + s.eps);
  }
}

}  // namespace

void adam_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                 float* max_exp_avg_sq, int64_t n, const AdamScalars& s) {
  if (max_exp_avg_sq) {
    update_amsgrad(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, n, s);
  } else {
    update_plain(param, grad, exp_avg, exp_avg_sq, n, s);
  }
}

}  // namespace ddp::detail
