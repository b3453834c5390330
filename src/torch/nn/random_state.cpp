#include "ddp/torch/nn/random_state.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Context.h>

#include <mutex>

namespace ddp {

namespace {

torch::Tensor state_of(at::Generator generator) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}

void set_state_of(at::Generator generator, const torch::Tensor& state) {
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

}  // namespace

std::optional<c10::Device> cuda_device_of(const torch::nn::Module& module) {
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (p.is_cuda()) return p.device();
  }
  for (const auto& b : module.buffers(/*recurse=*/true)) {
    if (b.is_cuda()) return b.device();
  }
  return std::nullopt;
}

RandomState capture_random_state(const torch::nn::Module& module) {
  RandomState state;
  state.cpu = state_of(at::detail::getDefaultCPUGenerator());
  if (const auto device = cuda_device_of(module)) {
    state.cuda = state_of(at::globalContext().defaultGenerator(*device));
  }
  return state;
}

void restore_random_state(const torch::nn::Module& module, const RandomState& state) {
  if (state.cpu.defined()) set_state_of(at::detail::getDefaultCPUGenerator(), state.cpu);
  if (!state.cuda.defined()) return;
  if (const auto device = cuda_device_of(module)) {
    set_state_of(at::globalContext().defaultGenerator(*device), state.cuda);
  }
}

}  // namespace ddp
