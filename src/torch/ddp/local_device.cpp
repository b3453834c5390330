#include "ddp/torch/ddp/local_device.hpp"

#include <fmt/format.h>

#include "ddp/comm/world_info.hpp"
#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"

namespace ddp {
namespace {

std::string visible_devices_env() {
  return env::get_or("CUDA_VISIBLE_DEVICES", "<unset>");
}

void require_cuda(const std::string& request) {
  if (torch::cuda::is_available()) return;
  throw UsageError(fmt::format(
      "device '{}': no CUDA device is usable: {}; use --device cpu (or auto), or run on a "
      "machine with an NVIDIA GPU and a CUDA build of LibTorch",
      request,
      built_with_cuda_torch()
          ? fmt::format("this LibTorch has CUDA but sees no GPU (CUDA_VISIBLE_DEVICES={})",
                        visible_devices_env())
          : std::string("this build's LibTorch is CPU-only")));
}

}  // namespace

int local_rank() {
  const WorldInfo world = detect_world_info();
  return world.local_rank.value_or(0);
}

torch::Device local_device(const std::string& request) {
  if (request == "cpu") return torch::Device(torch::kCPU);
  if (request == "auto") {
    return torch::cuda::is_available() ? local_device("cuda") : torch::Device(torch::kCPU);
  }
  const int count = static_cast<int>(torch::cuda::device_count());
  if (request == "cuda") {
    require_cuda(request);
    const int local = local_rank();
    if (local < 0 || local >= count) {
      throw UsageError(fmt::format(
          "device 'cuda': local rank {} has no GPU of its own: this process sees {} CUDA "
          "device(s) (CUDA_VISIBLE_DEVICES={}); start at most {} process(es) per node "
          "(--nproc-per-node {}), or give each process its own device with --device cuda:N",
          local, count, visible_devices_env(), count, count));
    }
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local));
  }
  if (request.rfind("cuda:", 0) == 0) {
    const std::string index = request.substr(5);
    const bool digits = !index.empty() && index.size() < 4 &&
                        index.find_first_not_of("0123456789") == std::string::npos;
    if (!digits) {
      throw UsageError(fmt::format(
          "device '{}': '{}' is not a device index; use cuda:0, cuda:1, ...", request, index));
    }
    require_cuda(request);
    const int n = std::stoi(index);
    if (n >= count) {
      throw UsageError(fmt::format(
          "device '{}': this process sees {} CUDA device(s) (CUDA_VISIBLE_DEVICES={}); pick "
          "cuda:0..cuda:{}",
          request, count, visible_devices_env(), count - 1));
    }
    return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(n));
  }
  throw UsageError(fmt::format(
      "device '{}' is not understood; use cpu, cuda (cuda:LOCAL_RANK), cuda:N or auto", request));
}

std::string default_backend(const torch::Device& device) {
  return device.is_cuda() ? "nccl" : "cpu";
}

}  // namespace ddp
