#include "ddp/torch/ddp/stream_order.hpp"

#include <fmt/format.h>

// The header declares NcclProcessGroup without CUDA types, so this compiles in every build;
// without the nccl backend no group is one and the casts below yield null.
#include "ddp/comm/nccl_process_group.hpp"
#include "ddp/util/error.hpp"

#if defined(DDP_WITH_CUDA_TORCH)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ddp {
namespace {

const NcclProcessGroup* as_nccl(const ProcessGroup& pg) {
  return dynamic_cast<const NcclProcessGroup*>(&pg);
}

}  // namespace

bool built_with_cuda_torch() {
#if defined(DDP_WITH_CUDA_TORCH)
  return true;
#else
  return false;
#endif
}

torch::Device comm_device(const ProcessGroup& pg) {
  const NcclProcessGroup* nccl = as_nccl(pg);
  if (nccl == nullptr) return torch::Device(torch::kCPU);
  if (!built_with_cuda_torch()) {
    throw UsageError(fmt::format(
        "rank {}: the nccl backend needs CUDA tensors, but this build's LibTorch is CPU-only; "
        "rebuild ddp against a CUDA LibTorch (docs/gpu.md) or use the cpu backend",
        pg.rank()));
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(nccl->device()));
}

void use_current_stream(ProcessGroup& pg) {
#if defined(DDP_WITH_CUDA_TORCH)
  if (auto* nccl = dynamic_cast<NcclProcessGroup*>(&pg)) {
    const auto device = static_cast<c10::DeviceIndex>(nccl->device());
    nccl->set_compute_stream(c10::cuda::getCurrentCUDAStream(device).stream());
  }
#else
  (void)pg;
#endif
}

void record_on_comm_stream(ProcessGroup& pg, const torch::Tensor& tensor) {
#if defined(DDP_WITH_CUDA_TORCH)
  if (!tensor.defined() || !tensor.is_cuda()) return;
  if (auto* nccl = dynamic_cast<NcclProcessGroup*>(&pg)) {
    const auto device = static_cast<c10::DeviceIndex>(nccl->device());
    c10::cuda::CUDACachingAllocator::recordStream(
        tensor.storage().data_ptr(),
        c10::cuda::getStreamFromExternal(nccl->communication_stream(), device));
  }
#else
  (void)pg;
  (void)tensor;
#endif
}

void wait_on_current_stream(ProcessGroup& pg, Work& work, std::chrono::milliseconds timeout) {
  use_current_stream(pg);
  work.wait(timeout);
}

void check_tensor_device(const ProcessGroup& pg, const torch::Tensor& tensor,
                         const std::string& what) {
  const NcclProcessGroup* nccl = as_nccl(pg);
  if (nccl == nullptr) return;
  const torch::Device want = comm_device(pg);
  if (tensor.device() != want) {
    throw UsageError(fmt::format(
        "rank {}: {} is on {} but the nccl group of this rank runs on {}; move the model to the "
        "rank's device before wrapping it (model->to(ddp::local_device(\"cuda\")))",
        pg.rank(), what, tensor.device().str(), want.str()));
  }
}

}  // namespace ddp
