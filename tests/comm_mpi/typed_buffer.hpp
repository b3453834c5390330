#pragma once
// TypedBuffer: a host buffer of any ddp::DataType whose elements tests read and write as
// double, rounding to the dtype on write (nearest even for the 16-bit floats). Reference
// values are computed in double from small integers, where every dtype is exact.

#include <cstdint>
#include <cstring>
#include <vector>

#include "ddp/comm/types.hpp"
#include "float16.hpp"

namespace ddp::test {

class TypedBuffer {
 public:
  TypedBuffer(DataType dtype, size_t count)
      : dtype_(dtype), count_(count), bytes_(count * element_size(dtype) + 1) {}

  DataType dtype() const { return dtype_; }
  size_t count() const { return count_; }
  void* data() { return bytes_.data(); }
  const void* data() const { return bytes_.data(); }
  unsigned char* at(size_t i) { return bytes_.data() + i * element_size(dtype_); }

  void set(size_t i, double v) {
    unsigned char* p = at(i);
    switch (dtype_) {
      case DataType::kFloat32:
        return put(p, static_cast<float>(v));
      case DataType::kFloat64:
        return put(p, v);
      case DataType::kFloat16:
        return put(p, float16::float_to_half(static_cast<float>(v)));
      case DataType::kBFloat16:
        return put(p, float16::float_to_bfloat16(static_cast<float>(v)));
      case DataType::kInt32:
        return put(p, static_cast<int32_t>(v));
      case DataType::kInt64:
        return put(p, static_cast<int64_t>(v));
      case DataType::kUInt8:
        return put(p, static_cast<uint8_t>(v));
    }
  }

  double get(size_t i) const {
    const unsigned char* p = bytes_.data() + i * element_size(dtype_);
    switch (dtype_) {
      case DataType::kFloat32:
        return take<float>(p);
      case DataType::kFloat64:
        return take<double>(p);
      case DataType::kFloat16:
        return float16::half_to_float(take<uint16_t>(p));
      case DataType::kBFloat16:
        return float16::bfloat16_to_float(take<uint16_t>(p));
      case DataType::kInt32:
        return take<int32_t>(p);
      case DataType::kInt64:
        return static_cast<double>(take<int64_t>(p));
      case DataType::kUInt8:
        return take<uint8_t>(p);
    }
    return 0;
  }

  // The value `v` becomes when stored in this dtype.
  double rounded(double v) const {
    TypedBuffer one(dtype_, 1);
    one.set(0, v);
    return one.get(0);
  }

 private:
  template <class T>
  static void put(unsigned char* p, T v) {
    std::memcpy(p, &v, sizeof v);
  }
  template <class T>
  static T take(const unsigned char* p) {
    T v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }

  DataType dtype_;
  size_t count_;
  std::vector<unsigned char> bytes_;  // one spare byte keeps data() non-null at count 0
};

}  // namespace ddp::test
