#include "half_convert.hpp"

#include <cstring>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define DDP_HAVE_F16C_PATH 1
#endif

namespace ddp::detail {

namespace {

// The bits of a float32 and back (std::bit_cast before C++20).
uint32_t bits_of(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  return x;
}

float float_of(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

}  // namespace

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
  return float_of(bits);
}

uint16_t float_to_half(float f) {
  const uint32_t x = bits_of(f);
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
  return float_of(static_cast<uint32_t>(b) << 16);
}

uint16_t float_to_bfloat16(float f) {
  uint32_t x = bits_of(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

namespace {

#ifdef DDP_HAVE_F16C_PATH
// Whether this CPU converts with F16C: CPUID leaf 1 has AVX and F16C, and the OS saves the AVX
// registers (OSXSAVE, and XCR0's SSE and AVX state bits). Read from CPUID itself because clang
// 14's __builtin_cpu_supports does not know "f16c".
bool cpu_has_avx_and_f16c() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return false;
  const unsigned needed = bit_OSXSAVE | bit_AVX | bit_F16C;
  if ((ecx & needed) != needed) return false;
  unsigned xcr0_low = 0, xcr0_high = 0;
  __asm__("xgetbv" : "=a"(xcr0_low), "=d"(xcr0_high) : "c"(0));
  return (xcr0_low & 0x6u) == 0x6u;
}

// Eight elements per instruction; the tail goes through the scalar conversion.
__attribute__((target("avx,f16c"))) void halves_to_floats_f16c(const uint16_t* in, float* out,
                                                               size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i));
    _mm256_storeu_ps(out + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) out[i] = half_to_float(in[i]);
}

__attribute__((target("avx,f16c"))) void floats_to_halves_f16c(const float* in, uint16_t* out,
                                                               size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 f = _mm256_loadu_ps(in + i);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  for (; i < n; ++i) out[i] = float_to_half(in[i]);
}
#endif

}  // namespace

bool half_conversions_use_f16c() {
#ifdef DDP_HAVE_F16C_PATH
  static const bool f16c = cpu_has_avx_and_f16c();
  return f16c;
#else
  return false;
#endif
}

void halves_to_floats(const uint16_t* in, float* out, size_t n) {
#ifdef DDP_HAVE_F16C_PATH
  if (half_conversions_use_f16c()) return halves_to_floats_f16c(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = half_to_float(in[i]);
}

void floats_to_halves(const float* in, uint16_t* out, size_t n) {
#ifdef DDP_HAVE_F16C_PATH
  if (half_conversions_use_f16c()) return floats_to_halves_f16c(in, out, n);
#endif
  for (size_t i = 0; i < n; ++i) out[i] = float_to_half(in[i]);
}

void bfloat16s_to_floats(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = bfloat16_to_float(in[i]);
}

void floats_to_bfloat16s(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = float_to_bfloat16(in[i]);
}

}  // namespace ddp::detail
