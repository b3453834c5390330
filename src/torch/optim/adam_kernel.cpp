#include "adam_kernel.hpp"

#include <cmath>

namespace ddp::detail {

namespace {

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// An AVX2 clone beside the baseline one, picked at load time. No FMA: each product is rounded
// before its sum, as in LibTorch's separate mul_/add_/addcmul_/addcdiv_ kernels.
#define DDP_ADAM_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define DDP_ADAM_CLONES
#endif

// The tests on weight_decay and vmax do not change inside the loop: the compiler moves them
// out (loop unswitching) and vectorises each of the resulting loops.
DDP_ADAM_CLONES
void update(float* __restrict p, const float* __restrict g, float* __restrict m,
            float* __restrict v, float* __restrict vmax, int64_t n, AdamScalars s) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = s.weight_decay != 0 ? g[i] + s.weight_decay * p[i] : g[i];
    const float mi = m[i] * s.beta1 + s.one_minus_beta1 * gi;
    const float vi = v[i] * s.beta2 + s.one_minus_beta2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    float denom_v = vi;
    if (vmax != nullptr) {
      denom_v = vmax[i] < vi ? vi : vmax[i];
      vmax[i] = denom_v;
    }
    p[i] = p[i] + -s.step_size * mi / (std::sqrt(denom_v) / s.sqrt_bias_correction2 + s.eps);
  }
}

}  // namespace

void adam_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                 float* max_exp_avg_sq, int64_t n, const AdamScalars& s) {
  update(param, grad, exp_avg, exp_avg_sq, max_exp_avg_sq, n, s);
}

}  // namespace ddp::detail
