#include "cuda_util.hpp"

#include <fmt/format.h>

#include <array>

#include "ddp/comm/nccl_process_group.hpp"
#include "ddp/util/error.hpp"

namespace ddp {

std::string cuda_pci_bus_id(int device) {
  std::array<char, 64> id{};  // "dddd:bb:dd.f" and a terminator need 13
  nccl_detail::check_cuda(cudaDeviceGetPCIBusId(id.data(), static_cast<int>(id.size()), device),
                          "cudaDeviceGetPCIBusId", -1);
  return id.data();
}

}  // namespace ddp

namespace ddp::nccl_detail {

void check_cuda(cudaError_t result, const char* what, int rank) {
  if (result == cudaSuccess) return;
  throw CollectiveError(fmt::format("nccl backend: rank {}: {} failed: {} ({})", rank, what,
                                    cudaGetErrorString(result), cudaGetErrorName(result)));
}

DeviceGuard::DeviceGuard(int device, int rank) : device_(device) {
  check_cuda(cudaGetDevice(&previous_), "cudaGetDevice", rank);
  if (previous_ != device_) check_cuda(cudaSetDevice(device_), "cudaSetDevice", rank);
}

DeviceGuard::~DeviceGuard() {
  if (previous_ >= 0 && previous_ != device_) cudaSetDevice(previous_);
}

ncclDataType_t to_nccl(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kUInt8:
      return ncclUint8;
  }
  throw UsageError(fmt::format("nccl backend: unknown dtype value {}; pass a ddp::DataType",
                               static_cast<int>(dtype)));
}

ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;  // floats: pre-multiplied by 1/size; integers: sum, then truncating division
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kProduct:
      return ncclProd;
  }
  throw UsageError(fmt::format("nccl backend: unknown reduce op value {}; pass a ddp::ReduceOp",
                               static_cast<int>(op)));
}

}  // namespace ddp::nccl_detail
