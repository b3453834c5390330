#pragma once
// Shared pieces of the checkpoint tests: a small model whose parameters are set without the
// global RNG (ranks run as threads), deterministic gradients, a temporary directory.

#include <torch/torch.h>

#include <filesystem>
#include <string>
#include "ddp/util/remove_tree.hpp"

namespace ddp::test {

// Linear(5,7) ReLU Linear(7,3) ReLU Linear(3,2): five parameters of different sizes, named
// "0.weight" ... "4.bias" like PyTorch's nn.Sequential.
inline torch::nn::Sequential make_model(double base) {
  torch::nn::Sequential m(torch::nn::Linear(5, 7), torch::nn::ReLU(), torch::nn::Linear(7, 3),
                          torch::nn::ReLU(), torch::nn::Linear(3, 2));
  torch::NoGradGuard no_grad;
  double k = base;
  for (auto& p : m->parameters()) {
    p.copy_(torch::arange(p.numel(), torch::kFloat32).reshape(p.sizes()).mul(0.01).add(k));
    k += 0.5;
  }
  return m;
}

// The same gradient on every rank for step `step`.
inline void set_grads(torch::nn::Module& m, int step) {
  for (auto& p : m.parameters()) {
    p.mutable_grad() = torch::sin(p.detach() * (step + 1)).mul(0.1);
  }
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/ddp_ckpt_test_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    ddp::remove_tree(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace ddp::test
