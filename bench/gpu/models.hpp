#pragma once
// The GPU step-time benchmark's models, mirrored layer for layer by torch_step.py:
//   cnn       the tutorials' Fashion-MNIST CNN (1.2 M parameters), input 1x28x28, 10 classes
//   resnet18  ResNet-18 (11.7 M parameters: 7x7 stem, four stages of two basic blocks, 64-512
//             channels, batch norm), input 3x224x224, 1000 classes

#include <torch/torch.h>

#include "ddp/torch/models/mnist_cnn.hpp"

#include <string>
#include <vector>

namespace ddp::bench {

// The shared tutorial CNN, without dropout, as in torch_step.py.
using Cnn = ddp::models::MnistCnn;

inline torch::nn::Conv2d conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad) {
  return torch::nn::Conv2d(
      torch::nn::Conv2dOptions(in, out, k).stride(stride).padding(pad).bias(false));
}

// Two 3x3 convolutions with batch norm and a shortcut (1x1 convolution when the shape changes).
struct BasicBlockImpl : torch::nn::Module {
  BasicBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1(register_module("conv1", conv(in, out, 3, stride, 1))),
        bn1(register_module("bn1", torch::nn::BatchNorm2d(out))),
        conv2(register_module("conv2", conv(out, out, 3, 1, 1))),
        bn2(register_module("bn2", torch::nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      down_conv = register_module("down_conv", conv(in, out, 1, stride, 0));
      down_bn = register_module("down_bn", torch::nn::BatchNorm2d(out));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    auto y = torch::relu(bn1(conv1(x)));
    y = bn2(conv2(y));
    auto shortcut = down_conv ? down_bn(down_conv(x)) : x;
    return torch::relu(y + shortcut);
  }
  // Declared in registration order (torchvision's BasicBlock: conv1, bn1, conv2, bn2), which the
  // initializer list follows: members are initialized in declaration order.
  torch::nn::Conv2d conv1;
  torch::nn::BatchNorm2d bn1;
  torch::nn::Conv2d conv2;
  torch::nn::BatchNorm2d bn2;
  torch::nn::Conv2d down_conv{nullptr};
  torch::nn::BatchNorm2d down_bn{nullptr};
};
TORCH_MODULE(BasicBlock);

struct ResNet18Impl : torch::nn::Module {
  ResNet18Impl()
      : stem(register_module("stem", conv(3, 64, 7, 2, 3))),
        stem_bn(register_module("stem_bn", torch::nn::BatchNorm2d(64))),
        fc(register_module("fc", torch::nn::Linear(512, 1000))) {
    const int64_t widths[4] = {64, 128, 256, 512};
    int64_t in = 64;
    for (int stage = 0; stage < 4; ++stage) {
      for (int b = 0; b < 2; ++b) {
        const int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
        blocks.push_back(
            register_module("layer" + std::to_string(stage + 1) + "_" + std::to_string(b),
                            BasicBlock(in, widths[stage], stride)));
        in = widths[stage];
      }
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    x = torch::relu(stem_bn(stem(x)));
    x = torch::max_pool2d(x, 3, 2, 1);
    for (auto& block : blocks) x = block->forward(x);
    x = torch::adaptive_avg_pool2d(x, {1, 1}).flatten(1);
    return torch::log_softmax(fc(x), 1);
  }
  torch::nn::Conv2d stem;
  torch::nn::BatchNorm2d stem_bn;
  torch::nn::Linear fc;
  std::vector<BasicBlock> blocks;
};
TORCH_MODULE(ResNet18);

}  // namespace ddp::bench
