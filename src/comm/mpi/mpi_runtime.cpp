#include "mpi_runtime.hpp"

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "ddp/util/error.hpp"
#include "float16.hpp"

namespace ddp::mpi_detail {
namespace {

// Finalises MPI at process exit when this backend initialised it (the application owns
// finalisation otherwise). Groups destroyed later see MPI_Finalized and skip MPI calls.
void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

// Element-wise reduction of 16-bit floats, computed in float and rounded back per element,
// which is what a float16 accumulator in any backend does.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float), ReduceOp Op>
void reduce_16bit(void* in, void* inout, int* len, MPI_Datatype* /*datatype*/) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) {
    const float x = ToFloat(a[i]);
    const float y = ToFloat(b[i]);
    float r = 0;
    switch (Op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        r = x + y;
        break;
      case ReduceOp::kMin:
        r = std::min(x, y);
        break;
      case ReduceOp::kMax:
        r = std::max(x, y);
        break;
      case ReduceOp::kProduct:
        r = x * y;
        break;
    }
    b[i] = FromFloat(r);
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void create_half_ops(MPI_Op (&ops)[5]) {
  MPI_User_function* functions[5] = {
      &reduce_16bit<ToFloat, FromFloat, ReduceOp::kSum>,
      &reduce_16bit<ToFloat, FromFloat, ReduceOp::kAvg>,
      &reduce_16bit<ToFloat, FromFloat, ReduceOp::kMin>,
      &reduce_16bit<ToFloat, FromFloat, ReduceOp::kMax>,
      &reduce_16bit<ToFloat, FromFloat, ReduceOp::kProduct>,
  };
  for (int i = 0; i < 5; ++i) {
    const int rc = MPI_Op_create(functions[i], /*commute=*/1, &ops[i]);
    if (rc != MPI_SUCCESS) {
      throw CollectiveError("mpi backend: MPI_Op_create for a 16-bit float reduction failed: " +
                            error_string(rc));
    }
  }
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "unknown MPI thread level";
}

}  // namespace

std::string error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return fmt::format("MPI error {}", code);
  return std::string(text, static_cast<size_t>(length));
}

Runtime& Runtime::get() {
  // Deliberately leaked: groups may be destroyed during static destruction, after which a
  // destroyed runtime would be a use-after-free. A failed construction throws and is retried
  // by the next call.
  static Runtime* runtime = new Runtime();
  return *runtime;
}

Runtime::Runtime() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) {
    throw UsageError(
        "mpi backend: MPI was already finalised in this process; create MPI process groups "
        "before calling MPI_Finalize");
  }
  if (initialized) {
    MPI_Query_thread(&thread_level_);
  } else {
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &thread_level_);
    if (rc != MPI_SUCCESS) {
      throw CollectiveError("mpi backend: MPI_Init_thread failed: " + error_string(rc) +
                            "; start the program with mpirun, or check the MPI installation");
    }
    std::atexit(finalize_at_exit);
  }
  serialised_ = thread_level_ < MPI_THREAD_MULTIPLE;
  if (thread_level_ < MPI_THREAD_SERIALIZED) {
    // Every MPI call of this backend is made by the thread that issues or waits, behind one
    // lock: correct if the application uses MPI from one thread only, as its level promises.
    spdlog::warn(
        "mpi backend: MPI runs at {} (initialised by the application); the backend serialises "
        "its MPI calls, but the application must use MPI and this backend from one thread. "
        "Initialise MPI with MPI_Init_thread(MPI_THREAD_MULTIPLE) to lift this.",
        thread_level_name(thread_level_));
  }
  create_half_ops<float16::half_to_float, float16::float_to_half>(half_ops_[0]);
  create_half_ops<float16::bfloat16_to_float, float16::float_to_bfloat16>(half_ops_[1]);
}

std::unique_lock<std::mutex> Runtime::lock() {
  if (serialised_) return std::unique_lock<std::mutex>(mutex_);
  return std::unique_lock<std::mutex>();
}

MPI_Datatype Runtime::datatype(DataType dtype) const {
  switch (dtype) {
    case DataType::kFloat32:
      return MPI_FLOAT;
    case DataType::kFloat64:
      return MPI_DOUBLE;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return MPI_UINT16_T;
    case DataType::kInt32:
      return MPI_INT32_T;
    case DataType::kInt64:
      return MPI_INT64_T;
    case DataType::kUInt8:
      return MPI_UINT8_T;
  }
  throw UsageError(fmt::format("mpi backend: unknown dtype value {}; pass a ddp::DataType",
                               static_cast<int>(dtype)));
}

MPI_Op Runtime::op(DataType dtype, ReduceOp op) const {
  const int index = static_cast<int>(op);
  if (index < 0 || index > static_cast<int>(ReduceOp::kProduct)) {
    throw UsageError(
        fmt::format("mpi backend: unknown reduce op value {}; pass a ddp::ReduceOp", index));
  }
  if (dtype == DataType::kFloat16) return half_ops_[0][index];
  if (dtype == DataType::kBFloat16) return half_ops_[1][index];
  datatype(dtype);  // validates dtype
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return MPI_SUM;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kProduct:
      return MPI_PROD;
  }
  return MPI_SUM;
}

}  // namespace ddp::mpi_detail
