#pragma once
// Element types and reduction operators understood by every ProcessGroup backend.
// Collectives take (pointer, count, dtype); the torch layer adapts tensors to these.

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp {

enum class DataType : uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt32,
  kInt64,
  kUInt8,
};

enum class ReduceOp : uint8_t {
  kSum,
  kAvg,
  kMin,
  kMax,
  kProduct,
};

// Size in bytes of one element of dtype.
size_t element_size(DataType dtype);

// Lower-case names used in messages and fingerprints: "float32", "sum", ...
const char* to_string(DataType dtype);
const char* to_string(ReduceOp op);

}  // namespace ddp
