#include "tensor_args.hpp"

#include <fmt/format.h>

#include "ddp/util/error.hpp"

namespace ddp::python {

std::optional<DataType> to_data_type(at::ScalarType type) {
  switch (type) {
    case at::kFloat:
      return DataType::kFloat32;
    case at::kDouble:
      return DataType::kFloat64;
    case at::kHalf:
      return DataType::kFloat16;
    case at::kBFloat16:
      return DataType::kBFloat16;
    case at::kInt:
      return DataType::kInt32;
    case at::kLong:
      return DataType::kInt64;
    case at::kByte:
      return DataType::kUInt8;
    default:
      return std::nullopt;
  }
}

void check_dense(const at::Tensor& t, const std::string& op) {
  if (!t.defined()) throw UsageError(fmt::format("{}: got an undefined tensor", op));
  if (!t.is_cpu() && !t.is_cuda()) {
    throw UsageError(fmt::format(
        "{}: the ddp backend takes CPU and CUDA tensors (got a tensor on {}); move it with "
        ".cpu() first",
        op, t.device().str()));
  }
  if (t.layout() != at::kStrided) {
    throw NotSupportedError(
        fmt::format("backend ddp does not support {} tensors (in {}); call .to_dense() first",
                    c10::str(t.layout()), op));
  }
}

const at::Tensor& single_tensor(const std::vector<at::Tensor>& tensors, const std::string& op) {
  if (tensors.size() != 1) {
    throw UsageError(fmt::format(
        "{}: the ddp backend takes exactly one tensor per process (got {}); the *_multigpu "
        "forms are not supported",
        op, tensors.size()));
  }
  check_dense(tensors[0], op);
  return tensors[0];
}

void check_same(const std::vector<at::Tensor>& ts, at::ScalarType dtype,
                std::optional<int64_t> numel, const std::string& op, const std::string& what) {
  for (size_t i = 0; i < ts.size(); ++i) {
    check_dense(ts[i], op);
    if (ts[i].scalar_type() != dtype) {
      throw UsageError(fmt::format("{}: {}[{}] has dtype {} but the input has {}", op, what, i,
                                   dtype_name(ts[i].scalar_type()), dtype_name(dtype)));
    }
    if (numel && ts[i].numel() != *numel) {
      throw UsageError(fmt::format(
          "{}: {}[{}] has {} elements but the input has {}; all tensors must have the same size",
          op, what, i, ts[i].numel(), *numel));
    }
  }
}

std::string dtype_name(at::ScalarType type) {
  if (auto dt = to_data_type(type)) return to_string(*dt);
  switch (type) {
    case at::kBool:
      return "bool";
    case at::kChar:
      return "int8";
    case at::kShort:
      return "int16";
    case at::kComplexHalf:
      return "complex32";
    case at::kComplexFloat:
      return "complex64";
    case at::kComplexDouble:
      return "complex128";
    default:
      return c10::toString(type);
  }
}

Elements move_elements(at::ScalarType type, int64_t numel) {
  if (auto dt = to_data_type(type)) return {*dt, static_cast<size_t>(numel)};
  return {DataType::kUInt8, static_cast<size_t>(numel) * c10::elementSize(type)};
}

DataType reduce_data_type(at::ScalarType type, const std::string& op) {
  if (auto dt = to_data_type(type)) return *dt;
  throw NotSupportedError(fmt::format(
      "backend ddp does not support dtype {} in {}; it reduces float32, float64, float16, "
      "bfloat16, int32, int64 and uint8",
      dtype_name(type), op));
}

}  // namespace ddp::python
