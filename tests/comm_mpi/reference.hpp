#pragma once
// Reference values for collective tests of any backend: the deterministic contribution of each
// rank and the result a correct collective produces, computed locally in double.

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <string>

#include "ddp/comm/types.hpp"
#include "typed_buffer.hpp"

namespace ddp::test {

// What rank `rank` contributes at element `i`: small positive integers, exact in every dtype;
// the sum over 4 ranks (28 at most) and the product (16 at most) fit every dtype exactly.
inline double contribution(int rank, size_t i, ReduceOp op) {
  if (op == ReduceOp::kProduct) return 1.0 + static_cast<double>((rank + i) % 2);
  return 1.0 + static_cast<double>((static_cast<size_t>(rank) * 3 + i * 5) % 7);
}

// op over every rank's contribution at element i, stored in `dtype`, computed the way the
// contract defines it (kAvg: the sum divided by size, truncating for integers).
inline double expected_reduction(ReduceOp op, int size, size_t i, DataType dtype) {
  double acc = contribution(0, i, op);
  for (int r = 1; r < size; ++r) {
    const double v = contribution(r, i, op);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kMin:
        acc = std::min(acc, v);
        break;
      case ReduceOp::kMax:
        acc = std::max(acc, v);
        break;
      case ReduceOp::kProduct:
        acc *= v;
        break;
    }
  }
  const TypedBuffer like(dtype, 1);
  if (op != ReduceOp::kAvg) return like.rounded(acc);
  const bool integral =
      dtype == DataType::kInt32 || dtype == DataType::kInt64 || dtype == DataType::kUInt8;
  if (integral) return static_cast<double>(static_cast<int64_t>(acc) / size);
  return like.rounded(like.rounded(acc) / size);
}

// Whether buffer[begin + k] == expected(k) for k < n; names the first mismatch.
inline ::testing::AssertionResult elements_equal(const TypedBuffer& buffer, size_t begin, size_t n,
                                                 const std::function<double(size_t)>& expected) {
  for (size_t k = 0; k < n; ++k) {
    const double got = buffer.get(begin + k);
    const double want = expected(k);
    if (got != want) {
      return ::testing::AssertionFailure()
             << "element " << begin + k << " is " << got << ", expected " << want;
    }
  }
  return ::testing::AssertionSuccess();
}

inline std::string describe_dtype(DataType dtype) {
  static const char* names[] = {"float32", "float64", "float16", "bfloat16",
                                "int32",   "int64",   "uint8"};
  return names[static_cast<int>(dtype)];
}

inline std::string describe(DataType dtype, ReduceOp op, size_t count) {
  static const char* ops[] = {"sum", "avg", "min", "max", "product"};
  return describe_dtype(dtype) + " " + ops[static_cast<int>(op)] + " count " +
         std::to_string(count);
}

constexpr DataType kAllDtypes[] = {DataType::kFloat32,  DataType::kFloat64, DataType::kFloat16,
                                   DataType::kBFloat16, DataType::kInt32,   DataType::kInt64,
                                   DataType::kUInt8};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin, ReduceOp::kMax,
                                ReduceOp::kProduct};
// Empty, small (eager protocol), and larger than OpenMPI's eager limits (rendezvous).
constexpr size_t kCounts[] = {0, 7, 20000};

}  // namespace ddp::test
