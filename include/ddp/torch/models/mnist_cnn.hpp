#pragma once
// The tutorials' MNIST / Fashion-MNIST CNN (PyTorch's MNIST example network), the one model
// the examples, tests and benchmarks share: conv 1->32 3x3, conv 32->64 3x3, max-pool 2,
// fc 9216->128, fc 128->10, log-softmax (for NLLLoss). Input N x 1 x 28 x 28.
//
// Dropout is an option: the tutorial trains with 0.25 after pooling and 0.5 before fc2
// (MnistCnnOptions::tutorial()); equivalence tests and benchmarks use none (the default) so that
// runs are deterministic and match their PyTorch twins step for step. Dropout modules hold no
// state, so the state_dict keys are the same either way.

#include <torch/torch.h>

namespace ddp::models {

struct MnistCnnOptions {
  double dropout_after_pool = 0.0;
  double dropout_before_fc2 = 0.0;

  // The tutorial's training network.
  static MnistCnnOptions tutorial() { return {0.25, 0.5}; }
};

struct MnistCnnImpl : torch::nn::Module {
  explicit MnistCnnImpl(MnistCnnOptions options = {})
      : conv1(register_module("conv1", torch::nn::Conv2d(1, 32, 3))),
        conv2(register_module("conv2", torch::nn::Conv2d(32, 64, 3))),
        dropout1(register_module("dropout1", torch::nn::Dropout(options.dropout_after_pool))),
        dropout2(register_module("dropout2", torch::nn::Dropout(options.dropout_before_fc2))),
        fc1(register_module("fc1", torch::nn::Linear(9216, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))),
        options_(options) {}

  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(conv1(x));
    x = torch::relu(conv2(x));
    x = torch::max_pool2d(x, 2);
    if (options_.dropout_after_pool > 0) x = dropout1(x);
    x = torch::relu(fc1(torch::flatten(x, 1)));
    if (options_.dropout_before_fc2 > 0) x = dropout2(x);
    return torch::log_softmax(fc2(x), 1);
  }

  torch::nn::Conv2d conv1, conv2;
  torch::nn::Dropout dropout1, dropout2;
  torch::nn::Linear fc1, fc2;

 private:
  MnistCnnOptions options_;
};
TORCH_MODULE(MnistCnn);

}  // namespace ddp::models
