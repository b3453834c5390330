#pragma once
// A small GPT-style decoder-only language model, the examples' and benchmarks' second workload
// (tens of MB of gradients per step where the CNN has 4.8 MB):
//
//   token embedding + learned position embedding
//   n_layers x pre-LayerNorm block:  x += attn(ln_1(x));  x += mlp(ln_2(x))
//     attn: one Linear to q, k, v; n_heads heads of causal scaled_dot_product_attention; Linear
//     mlp:  Linear d -> 4d, GELU (exact erf form), Linear 4d -> d
//   final LayerNorm, LM head
//
// The LM head is tied to the token embedding by default (GPT-2's choice): logits =
// linear(x, wte.weight), no separate parameter, so the embedding's gradient sums both uses and
// is ready only at the very end of backward. tie_weights(false) adds an `lm_head` Linear without
// bias. No dropout: runs are deterministic and match bench/ddp/bench_gpt.py's twin, which has
// the same parameter names and order (wte, wpe, blocks.i.{ln_1, attn.c_attn, attn.c_proj, ln_2,
// mlp.c_fc, mlp.c_proj}, ln_f, lm_head) and the same initialization: after the layers' own
// resets, every Linear and Embedding weight is redrawn from N(0, 0.02^2) in registration order,
// the residual projections (c_proj) from N(0, (0.02 / sqrt(2 n_layers))^2), biases zero,
// LayerNorms (1, 0). With the same torch::manual_seed both sides start from the same numbers.
//
// The defaults (vocab 8192, context 128, d_model 384, 6 heads, 6 layers, tied) have
// 13,842,432 parameters; untied, 16,988,160 (gpt_parameter_count()).
//
// Input: int64 tokens [batch, T] with T <= context_length; output: logits [batch, T, vocab].

#include <torch/arg.h>
#include <torch/torch.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "ddp/util/error.hpp"

namespace ddp::models {

struct GptOptions {
  TORCH_ARG(int64_t, vocab_size) = 8192;
  TORCH_ARG(int64_t, context_length) = 128;
  TORCH_ARG(int64_t, d_model) = 384;
  // d_model must be a multiple of n_heads.
  TORCH_ARG(int64_t, n_heads) = 6;
  TORCH_ARG(int64_t, n_layers) = 6;
  // The LM head reuses the token embedding's matrix (no lm_head parameter).
  TORCH_ARG(bool, tie_weights) = true;
  // Standard deviation of the weights' initialization (GPT-2's 0.02).
  TORCH_ARG(double, init_std) = 0.02;
};

// The number of parameters a GPT with these options has, without building it:
// V d + C d + L (12 d^2 + 13 d) + 2 d, plus V d untied.
inline int64_t gpt_parameter_count(const GptOptions& o) {
  const int64_t d = o.d_model();
  const int64_t per_block = 12 * d * d + 13 * d;
  return o.vocab_size() * d + o.context_length() * d + o.n_layers() * per_block + 2 * d +
         (o.tie_weights() ? 0 : o.vocab_size() * d);
}

namespace detail {

inline void init_normal(torch::Tensor& weight, double std) {
  torch::NoGradGuard no_grad;
  weight.normal_(0.0, std);
}

inline void init_linear(torch::nn::Linear& linear, double std) {
  init_normal(linear->weight, std);
  if (linear->bias.defined()) {
    torch::NoGradGuard no_grad;
    linear->bias.zero_();
  }
}

}  // namespace detail

// Causal multi-head self-attention: [B, T, d] -> [B, T, d].
class GptAttentionImpl : public torch::nn::Module {
 public:
  explicit GptAttentionImpl(const GptOptions& o)
      : c_attn(register_module("c_attn", torch::nn::Linear(o.d_model(), 3 * o.d_model()))),
        c_proj(register_module("c_proj", torch::nn::Linear(o.d_model(), o.d_model()))),
        n_heads_(o.n_heads()) {}

  torch::Tensor forward(const torch::Tensor& x) {
    const int64_t b = x.size(0), t = x.size(1), d = x.size(2);
    auto qkv = c_attn(x).split(d, /*dim=*/2);
    // [B, T, d] -> [B, heads, T, d / heads]
    auto heads = [&](const torch::Tensor& y) {
      return y.view({b, t, n_heads_, d / n_heads_}).transpose(1, 2);
    };
    auto y = torch::scaled_dot_product_attention(heads(qkv[0]), heads(qkv[1]), heads(qkv[2]),
                                                 /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                 /*is_causal=*/true);
    return c_proj(y.transpose(1, 2).contiguous().view({b, t, d}));
  }

  torch::nn::Linear c_attn, c_proj;

 private:
  int64_t n_heads_;
};
TORCH_MODULE(GptAttention);

class GptMlpImpl : public torch::nn::Module {
 public:
  explicit GptMlpImpl(const GptOptions& o)
      : c_fc(register_module("c_fc", torch::nn::Linear(o.d_model(), 4 * o.d_model()))),
        c_proj(register_module("c_proj", torch::nn::Linear(4 * o.d_model(), o.d_model()))) {}

  torch::Tensor forward(const torch::Tensor& x) { return c_proj(torch::gelu(c_fc(x))); }

  torch::nn::Linear c_fc, c_proj;
};
TORCH_MODULE(GptMlp);

// One pre-LayerNorm transformer block.
class GptBlockImpl : public torch::nn::Module {
 public:
  explicit GptBlockImpl(const GptOptions& o)
      : ln_1(register_module("ln_1",
                             torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model()})))),
        attn(register_module("attn", GptAttention(o))),
        ln_2(register_module("ln_2",
                             torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model()})))),
        mlp(register_module("mlp", GptMlp(o))) {}

  torch::Tensor forward(torch::Tensor x) {
    x = x + attn(ln_1(x));
    return x + mlp(ln_2(x));
  }

  torch::nn::LayerNorm ln_1;
  GptAttention attn;
  torch::nn::LayerNorm ln_2;
  GptMlp mlp;
};
TORCH_MODULE(GptBlock);

class GptImpl : public torch::nn::Module {
 public:
  // Throws UsageError when d_model is not a positive multiple of n_heads or a size is below 1.
  explicit GptImpl(GptOptions o = {}) : options_(check(o)) {
    wte = register_module("wte", torch::nn::Embedding(o.vocab_size(), o.d_model()));
    wpe = register_module("wpe", torch::nn::Embedding(o.context_length(), o.d_model()));
    blocks = register_module("blocks", torch::nn::ModuleList());
    for (int64_t i = 0; i < o.n_layers(); ++i) blocks->push_back(GptBlock(o));
    ln_f =
        register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({o.d_model()})));
    if (!o.tie_weights()) {
      lm_head = register_module(
          "lm_head",
          torch::nn::Linear(torch::nn::LinearOptions(o.d_model(), o.vocab_size()).bias(false)));
    }
    // Redrawn in registration order, after every layer's own reset (see the file comment).
    const double std = o.init_std();
    const double residual_std = std / std::sqrt(2.0 * static_cast<double>(o.n_layers()));
    detail::init_normal(wte->weight, std);
    detail::init_normal(wpe->weight, std);
    for (const auto& m : *blocks) {
      auto* block = m->as<GptBlockImpl>();
      detail::init_linear(block->attn->c_attn, std);
      detail::init_linear(block->attn->c_proj, residual_std);
      detail::init_linear(block->mlp->c_fc, std);
      detail::init_linear(block->mlp->c_proj, residual_std);
    }
    if (lm_head) detail::init_linear(lm_head, std);
  }

  // tokens: int64 [B, T], T <= context_length. Returns logits [B, T, vocab_size].
  torch::Tensor forward(const torch::Tensor& tokens) {
    const int64_t t = tokens.size(1);
    if (t > options_.context_length()) {
      throw UsageError(
          "Gpt: sequence of " + std::to_string(t) + " tokens is longer than the context length " +
          std::to_string(options_.context_length()) + " (GptOptions().context_length)");
    }
    auto x = wte(tokens) + wpe(torch::arange(t, tokens.options()));
    for (const auto& m : *blocks) x = m->as<GptBlockImpl>()->forward(x);
    x = ln_f(x);
    return lm_head ? lm_head(x) : torch::linear(x, wte->weight);
  }

  const GptOptions& options() const { return options_; }

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};  // null when tied to wte

 private:
  static GptOptions check(const GptOptions& o) {
    if (o.vocab_size() < 1 || o.context_length() < 1 || o.n_layers() < 0 || o.n_heads() < 1 ||
        o.d_model() < 1 || o.d_model() % o.n_heads() != 0) {
      throw UsageError("Gpt: vocab_size " + std::to_string(o.vocab_size()) + ", context_length " +
                       std::to_string(o.context_length()) + ", n_layers " +
                       std::to_string(o.n_layers()) + ": must be positive; d_model " +
                       std::to_string(o.d_model()) + " must be a positive multiple of n_heads " +
                       std::to_string(o.n_heads()));
    }
    return o;
  }

  GptOptions options_;
};
TORCH_MODULE(Gpt);

}  // namespace ddp::models
