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

RandomState capture_random_state(std::optional<c10::Device> cuda_device) {
  RandomState state;
  state.cpu = state_of(at::detail::getDefaultCPUGenerator());
  if (cuda_device) state.cuda = state_of(at::globalContext().defaultGenerator(*cuda_device));
  return state;
}

void restore_random_state(std::optional<c10::Device> cuda_device, const RandomState& state) {
  if (state.cpu.defined()) set_state_of(at::detail::getDefaultCPUGenerator(), state.cpu);
  if (cuda_device && state.cuda.defined()) {
    set_state_of(at::globalContext().defaultGenerator(*cuda_device), state.cuda);
  }
}

}  // namespace ddp
