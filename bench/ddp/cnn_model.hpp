#pragma once
// The tutorials' MNIST CNN (the model the DDP benchmarks train; same as bench_ddp.py's).

#include <torch/torch.h>

namespace ddp::bench {

struct CnnImpl : torch::nn::Module {
  CnnImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(1, 32, 3))),
        conv2(register_module("conv2", torch::nn::Conv2d(32, 64, 3))),
        fc1(register_module("fc1", torch::nn::Linear(9216, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(conv1(x));
    x = torch::relu(conv2(x));
    x = torch::max_pool2d(x, 2).flatten(1);
    x = torch::relu(fc1(x));
    return torch::log_softmax(fc2(x), 1);
  }
  torch::nn::Conv2d conv1;
  torch::nn::Conv2d conv2;
  torch::nn::Linear fc1;
  torch::nn::Linear fc2;
};
TORCH_MODULE(Cnn);

}  // namespace ddp::bench
