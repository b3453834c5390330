#pragma once
// Host-side element arithmetic the MPI backend applies after a reduction completes.

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "ddp/comm/types.hpp"
#include "float16.hpp"

namespace ddp::mpi_detail {

// data[i] /= divisor for count elements: kAvg is a sum followed by this. Integer types use
// C++'s truncating division (the ProcessGroup contract); 16-bit floats divide in float and
// round back to nearest even.
inline void divide(void* data, size_t count, DataType dtype, int divisor) {
  auto each = [&](auto* values) {
    using T = std::remove_pointer_t<decltype(values)>;
    for (size_t i = 0; i < count; ++i) values[i] = static_cast<T>(values[i] / divisor);
  };
  switch (dtype) {
    case DataType::kFloat32:
      return each(static_cast<float*>(data));
    case DataType::kFloat64:
      return each(static_cast<double*>(data));
    case DataType::kInt32:
      return each(static_cast<int32_t*>(data));
    case DataType::kInt64:
      return each(static_cast<int64_t*>(data));
    case DataType::kUInt8:
      return each(static_cast<uint8_t*>(data));
    case DataType::kFloat16: {
      auto* values = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) {
        values[i] = float16::float_to_half(float16::half_to_float(values[i]) / divisor);
      }
      return;
    }
    case DataType::kBFloat16: {
      auto* values = static_cast<uint16_t*>(data);
      for (size_t i = 0; i < count; ++i) {
        values[i] = float16::float_to_bfloat16(float16::bfloat16_to_float(values[i]) / divisor);
      }
      return;
    }
  }
}

}  // namespace ddp::mpi_detail
