#include "cuda_util.hpp"

#include <fmt/format.h>

#include "ddp/util/error.hpp"

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

size_t dtype_size(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat64:
    case DataType::kInt64:
      return 8;
    case DataType::kFloat32:
    case DataType::kInt32:
      return 4;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kUInt8:
      return 1;
  }
  return 0;
}

const char* dtype_name(DataType dtype) {
  static const char* names[] = {"float32", "float64", "float16", "bfloat16",
                                "int32",   "int64",   "uint8"};
  const auto index = static_cast<size_t>(dtype);
  return index < sizeof names / sizeof names[0] ? names[index] : "unknown-dtype";
}

const char* op_name(ReduceOp op) {
  static const char* names[] = {"sum", "avg", "min", "max", "product"};
  const auto index = static_cast<size_t>(op);
  return index < sizeof names / sizeof names[0] ? names[index] : "unknown-op";
}

}  // namespace ddp::nccl_detail
