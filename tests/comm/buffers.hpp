#pragma once
// Test helper: typed buffers filled from doubles, and a local reference for reductions.

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ddp/comm/types.hpp"
#include "reduce_kernels.hpp"

namespace ddp::test {

inline const DataType kAllDtypes[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                                      DataType::kBFloat16, DataType::kInt32,   DataType::kInt64,
                                      DataType::kUInt8};
inline const ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                                   ReduceOp::kProduct};

// Stores x as dtype at index i (integers: converted modulo 2^bits like a C++ cast of int64).
inline void put(DataType t, void* p, size_t i, double x) {
  switch (t) {
    case DataType::kFloat32:
      static_cast<float*>(p)[i] = static_cast<float>(x);
      break;
    case DataType::kFloat64:
      static_cast<double*>(p)[i] = x;
      break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(p)[i] = detail::float_to_half(static_cast<float>(x));
      break;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(p)[i] = detail::float_to_bfloat16(static_cast<float>(x));
      break;
    case DataType::kInt32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(static_cast<int64_t>(x));
      break;
    case DataType::kInt64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(x);
      break;
    case DataType::kUInt8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int64_t>(x));
      break;
  }
}

inline double get(DataType t, const void* p, size_t i) {
  switch (t) {
    case DataType::kFloat32:
      return static_cast<const float*>(p)[i];
    case DataType::kFloat64:
      return static_cast<const double*>(p)[i];
    case DataType::kFloat16:
      return detail::half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DataType::kBFloat16:
      return detail::bfloat16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DataType::kInt32:
      return static_cast<const int32_t*>(p)[i];
    case DataType::kInt64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DataType::kUInt8:
      return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

inline bool is_integer(DataType t) {
  return t == DataType::kInt32 || t == DataType::kInt64 || t == DataType::kUInt8;
}

// Small positive integers, exact in every dtype; products stay in {1, 2}.
inline double input_value(int rank, size_t i, ReduceOp op) {
  if (op == ReduceOp::kProduct) return static_cast<double>((rank + i) % 2 + 1);
  return static_cast<double>((rank * 7 + i * 3) % 5 + 1);
}

inline std::vector<uint8_t> make_input(DataType t, size_t count, int rank, ReduceOp op,
                                       size_t offset = 0) {
  std::vector<uint8_t> buf(count * element_size(t) + 1);
  for (size_t i = 0; i < count; ++i) put(t, buf.data(), i, input_value(rank, offset + i, op));
  return buf;
}

// op over ranks 0..world-1 of input_value, rounded to dtype as the library stores it.
inline double expected_reduction(DataType t, ReduceOp op, int world, size_t i) {
  double acc = input_value(0, i, op);
  for (int r = 1; r < world; ++r) {
    const double v = input_value(r, i, op);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kProduct:
        acc *= v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
    }
  }
  if (op == ReduceOp::kAvg) {
    if (is_integer(t)) {
      // uint8 sums wrap before dividing, like the element type does.
      if (t == DataType::kUInt8) acc = static_cast<double>(static_cast<uint8_t>(acc));
      acc = std::trunc(acc / world);
    } else if (t == DataType::kFloat64) {
      acc = acc / world;
    } else {
      acc = static_cast<float>(acc) / static_cast<float>(world);
    }
  }
  uint8_t tmp[8];
  put(t, tmp, 0, acc);
  return get(t, tmp, 0);
}

}  // namespace ddp::test
