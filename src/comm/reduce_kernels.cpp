#include "reduce_kernels.hpp"

#include <algorithm>
#include <cstring>

#include "ddp/util/error.hpp"

namespace ddp::detail {

float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf / nan
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half: normalise into a float.
    exp = 113;
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_half(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t absx = x & 0x7fffffffu;
  if (absx >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0u));
  }
  if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (absx < 0x38800000u) {
    // Result is subnormal or zero: shift the mantissa with the implicit bit, round to even.
    if (absx < 0x33000000u) return sign;
    const uint32_t e = absx >> 23;
    const uint32_t m = (absx & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = absx - 0x38000000u;  // rebias exponent from 127 to 15
  const uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

float bfloat16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t float_to_bfloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

namespace {

// Storage type S is loaded into accumulator type A and stored back.
template <typename S, typename A>
struct Native {
  using Storage = S;
  using Acc = A;
  static A load(S v) { return static_cast<A>(v); }
  static S store(A v) { return static_cast<S>(v); }
};
struct Half {
  using Storage = uint16_t;
  using Acc = float;
  static float load(uint16_t v) { return half_to_float(v); }
  static uint16_t store(float v) { return float_to_half(v); }
};
struct BFloat {
  using Storage = uint16_t;
  using Acc = float;
  static float load(uint16_t v) { return bfloat16_to_float(v); }
  static uint16_t store(float v) { return float_to_bfloat16(v); }
};

template <typename A>
inline A apply(ReduceOp op, A a, A b) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return a + b;
    case ReduceOp::kProduct:
      return a * b;
    case ReduceOp::kMin:
      return b < a ? b : a;
    case ReduceOp::kMax:
      return b > a ? b : a;
  }
  return a;
}

// The op is a template parameter so the inner loops vectorise.
template <typename Tr, typename F>
void reduce_blocks(F f, typename Tr::Storage* dst, typename Tr::Storage* dst2,
                   const void* const* srcs, size_t nsrc, size_t count, int avg_divisor) {
  using S = typename Tr::Storage;
  using A = typename Tr::Acc;
  constexpr size_t kBlock = 1024;
  A acc[kBlock];
  for (size_t base = 0; base < count; base += kBlock) {
    const size_t n = std::min(kBlock, count - base);
    const S* s0 = static_cast<const S*>(srcs[0]) + base;
    for (size_t i = 0; i < n; ++i) acc[i] = Tr::load(s0[i]);
    for (size_t k = 1; k < nsrc; ++k) {
      const S* sk = static_cast<const S*>(srcs[k]) + base;
      for (size_t i = 0; i < n; ++i) acc[i] = f(acc[i], Tr::load(sk[i]));
    }
    if (avg_divisor > 0) {
      const A d = static_cast<A>(avg_divisor);
      for (size_t i = 0; i < n; ++i) acc[i] = acc[i] / d;
    }
    S* out = dst + base;
    for (size_t i = 0; i < n; ++i) out[i] = Tr::store(acc[i]);
    if (dst2 != nullptr) std::memcpy(dst2 + base, out, n * sizeof(S));
  }
}

template <typename Tr>
void reduce_typed(ReduceOp op, void* dst, void* dst2, const void* const* srcs, size_t nsrc,
                  size_t count, int avg_divisor) {
  using A = typename Tr::Acc;
  auto* d = static_cast<typename Tr::Storage*>(dst);
  auto* d2 = static_cast<typename Tr::Storage*>(dst2);
  const int div = op == ReduceOp::kAvg ? avg_divisor : 0;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return reduce_blocks<Tr>([](A a, A b) { return a + b; }, d, d2, srcs, nsrc, count, div);
    case ReduceOp::kProduct:
      return reduce_blocks<Tr>([](A a, A b) { return a * b; }, d, d2, srcs, nsrc, count, div);
    case ReduceOp::kMin:
      return reduce_blocks<Tr>([](A a, A b) { return b < a ? b : a; }, d, d2, srcs, nsrc, count,
                               div);
    case ReduceOp::kMax:
      return reduce_blocks<Tr>([](A a, A b) { return b > a ? b : a; }, d, d2, srcs, nsrc, count,
                               div);
  }
}

template <typename Fn>
void dispatch(DataType dtype, Fn&& fn) {
  switch (dtype) {
    case DataType::kFloat32:
      return fn(Native<float, float>{});
    case DataType::kFloat64:
      return fn(Native<double, double>{});
    case DataType::kFloat16:
      return fn(Half{});
    case DataType::kBFloat16:
      return fn(BFloat{});
    case DataType::kInt32:
      return fn(Native<int32_t, int32_t>{});
    case DataType::kInt64:
      return fn(Native<int64_t, int64_t>{});
    case DataType::kUInt8:
      // Accumulate in uint8 so sums and products wrap like PyTorch's uint8 tensors.
      return fn(Native<uint8_t, uint8_t>{});
  }
  throw UsageError("unknown DataType value " + std::to_string(static_cast<int>(dtype)));
}

}  // namespace

void reduce_buffers(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, size_t nsrc,
                    size_t count, int avg_divisor, void* dst2) {
  if (nsrc == 0) throw UsageError("reduce_buffers needs at least one source");
  dispatch(dtype, [&](auto tr) {
    reduce_typed<decltype(tr)>(op, dst, dst2, srcs, nsrc, count, avg_divisor);
  });
}

void accumulate(DataType dtype, ReduceOp op, void* dst, const void* src, size_t count) {
  const void* srcs[2] = {dst, src};
  reduce_buffers(dtype, op == ReduceOp::kAvg ? ReduceOp::kSum : op, dst, srcs, 2, count, 0);
}

void divide_in_place(DataType dtype, void* data, size_t count, int divisor) {
  const void* srcs[1] = {data};
  reduce_buffers(dtype, ReduceOp::kAvg, data, srcs, 1, count, divisor);
}

}  // namespace ddp::detail
