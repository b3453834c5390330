#include "ddp/torch/ddp/tensor_adapter.hpp"

#include <fmt/format.h>

#include "ddp/torch/ddp/stream_order.hpp"
#include "ddp/util/error.hpp"

namespace ddp {

std::optional<DataType> to_data_type(c10::ScalarType type) {
  switch (type) {
    case c10::ScalarType::Float:
      return DataType::kFloat32;
    case c10::ScalarType::Double:
      return DataType::kFloat64;
    case c10::ScalarType::Half:
      return DataType::kFloat16;
    case c10::ScalarType::BFloat16:
      return DataType::kBFloat16;
    case c10::ScalarType::Int:
      return DataType::kInt32;
    case c10::ScalarType::Long:
      return DataType::kInt64;
    case c10::ScalarType::Byte:
      return DataType::kUInt8;
    default:
      return std::nullopt;
  }
}

c10::ScalarType to_scalar_type(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32:
      return c10::ScalarType::Float;
    case DataType::kFloat64:
      return c10::ScalarType::Double;
    case DataType::kFloat16:
      return c10::ScalarType::Half;
    case DataType::kBFloat16:
      return c10::ScalarType::BFloat16;
    case DataType::kInt32:
      return c10::ScalarType::Int;
    case DataType::kInt64:
      return c10::ScalarType::Long;
    case DataType::kUInt8:
      return c10::ScalarType::Byte;
  }
  throw UsageError(fmt::format("unknown ddp::DataType {}", static_cast<int>(dtype)));
}

TensorBuffer tensor_buffer(const torch::Tensor& tensor, const std::string& what) {
  if (!tensor.defined()) {
    throw UsageError(fmt::format("{} is an undefined tensor; collectives need real storage", what));
  }
  if (tensor.layout() != c10::kStrided) {
    throw UsageError(fmt::format(
        "{} has layout {}; collectives support dense (strided) tensors only: call .to_dense()",
        what, c10::toString(tensor.layout())));
  }
  if (!tensor.is_contiguous()) {
    throw UsageError(
        fmt::format("{} (sizes {}) is not contiguous; collectives need one contiguous block: call "
                    ".contiguous() and reduce that tensor",
                    what, c10::str(tensor.sizes())));
  }
  auto dtype = to_data_type(tensor.scalar_type());
  if (!dtype) {
    throw UsageError(fmt::format(
        "{} has dtype {}, which collectives do not support; supported: float32, float64, "
        "float16, bfloat16, int32, int64, uint8 (convert with .to(torch::kFloat32))",
        what, c10::toString(tensor.scalar_type())));
  }
  return TensorBuffer{tensor.data_ptr(), static_cast<size_t>(tensor.numel()), *dtype};
}

bool needs_host_staging(const torch::Tensor& tensor, const ProcessGroup& pg) {
  return tensor.is_cuda() && pg.backend_name() != "nccl";
}

torch::Tensor pinned_host_copy(const torch::Tensor& tensor) {
  torch::Tensor host = torch::empty(
      tensor.sizes(), tensor.options().device(torch::kCPU).pinned_memory(tensor.is_cuda()));
  host.copy_(tensor);
  return host;
}

WorkPtr all_reduce(ProcessGroup& pg, const torch::Tensor& tensor, ReduceOp op) {
  TensorBuffer b = tensor_buffer(tensor);
  use_current_stream(pg);
  WorkPtr work = pg.all_reduce(b.data, b.count, b.dtype, op);
  record_on_comm_stream(pg, tensor);
  return work;
}

WorkPtr broadcast(ProcessGroup& pg, const torch::Tensor& tensor, int root) {
  TensorBuffer b = tensor_buffer(tensor);
  use_current_stream(pg);
  WorkPtr work = pg.broadcast(b.data, b.count, b.dtype, root);
  record_on_comm_stream(pg, tensor);
  return work;
}

}  // namespace ddp
