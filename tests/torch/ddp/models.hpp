#pragma once
// Models of the DDP tests: the tutorials' MNIST CNN and a model with optional branches.

#include <torch/torch.h>

#include "ddp/torch/models/mnist_cnn.hpp"

namespace ddp::test {

// The shared tutorial CNN, without dropout (deterministic for equivalence checks).
using Cnn = ddp::models::MnistCnn;

// a is always used; b only where the caller says (rows selected by mask); never is never used.
struct BranchyImpl : torch::nn::Module {
  BranchyImpl()
      : a(register_module("a", torch::nn::Linear(6, 3))),
        b(register_module("b", torch::nn::Linear(6, 3))),
        never(register_module("never", torch::nn::Linear(6, 3))) {}
  // mask: per-row 0/1 weight of branch b; when use_b is false b is not in the graph at all.
  torch::Tensor forward(torch::Tensor x, bool use_b, torch::Tensor mask) {
    auto out = a(x);
    if (use_b) out = out + b(x) * mask.unsqueeze(1);
    return out;
  }
  torch::nn::Linear a;
  torch::nn::Linear b;
  torch::nn::Linear never;
};
TORCH_MODULE(Branchy);

// Registers `head` before `body` but runs body first: backward produces head's gradients
// first, the reverse of what reverse registration order predicts.
struct ReorderedImpl : torch::nn::Module {
  ReorderedImpl()
      : head(register_module("head", torch::nn::Linear(8, 3))),
        body(register_module("body", torch::nn::Linear(6, 8))) {}
  torch::Tensor forward(torch::Tensor x) { return head(torch::relu(body(x))); }
  torch::nn::Linear head;
  torch::nn::Linear body;
};
TORCH_MODULE(Reordered);

// Copies every parameter and buffer of `from` into `to` (same architecture).
inline void copy_state(torch::nn::Module& from, torch::nn::Module& to) {
  torch::NoGradGuard no_grad;
  auto src = from.named_parameters(true);
  for (auto& item : to.named_parameters(true)) item.value().copy_(src[item.key()]);
  auto bsrc = from.named_buffers(true);
  for (auto& item : to.named_buffers(true)) item.value().copy_(bsrc[item.key()]);
}

// max over parameters of ||a - b|| / ||b||.
inline double max_relative_error(torch::nn::Module& a, torch::nn::Module& b) {
  double worst = 0;
  auto pb = b.named_parameters(true);
  for (auto& item : a.named_parameters(true)) {
    const auto& ref = pb[item.key()];
    double err = (item.value() - ref).norm().item<double>() / (ref.norm().item<double>() + 1e-30);
    worst = std::max(worst, err);
  }
  return worst;
}

}  // namespace ddp::test
