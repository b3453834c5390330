// The float <-> float16/bfloat16 conversions behind the MPI backend's 16-bit reductions: every
// 16-bit value survives a round trip, and rounding is to nearest even at normal, subnormal
// and overflow boundaries.

#include "float16.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace ddp::float16 {
namespace {

TEST(Float16, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(half_to_float(float_to_half(f)))) << std::hex << h;
      continue;
    }
    EXPECT_EQ(float_to_half(f), h) << std::hex << h;
  }
}

TEST(Float16, EveryBfloat16RoundTripsThroughFloat) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = bfloat16_to_float(static_cast<uint16_t>(b));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(f)))) << std::hex << b;
      continue;
    }
    EXPECT_EQ(float_to_bfloat16(f), b) << std::hex << b;
  }
}

TEST(Float16, HalfRoundsToNearestEven) {
  EXPECT_EQ(half_to_float(float_to_half(1.0f + std::ldexp(1.0f, -11))), 1.0f);  // tie, even down
  EXPECT_EQ(half_to_float(float_to_half(1.0f + 3 * std::ldexp(1.0f, -11))),
            1.0f + std::ldexp(1.0f, -9));  // tie, even up
  EXPECT_EQ(half_to_float(float_to_half(1.0f + std::ldexp(1.0f, -10) * 0.75f)),
            1.0f + std::ldexp(1.0f, -10));                          // above the tie
  EXPECT_EQ(half_to_float(float_to_half(65504.0f)), 65504.0f);      // largest finite
  EXPECT_TRUE(std::isinf(half_to_float(float_to_half(65520.0f))));  // rounds to infinity
  EXPECT_EQ(half_to_float(float_to_half(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(float_to_half(std::ldexp(1.0f, -25))), 0.0f);  // tie to even zero
  EXPECT_EQ(half_to_float(float_to_half(std::ldexp(1.5f, -25))), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(float_to_half(-2.5f)), -2.5f);
}

TEST(Float16, Bfloat16RoundsToNearestEven) {
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(1.0f + 3 * std::ldexp(1.0f, -8))),
            1.0f + std::ldexp(1.0f, -6));
  EXPECT_EQ(bfloat16_to_float(float_to_bfloat16(257.0f)), 256.0f);
  EXPECT_TRUE(std::isinf(bfloat16_to_float(float_to_bfloat16(std::numeric_limits<float>::max()))));
}

}  // namespace
}  // namespace ddp::float16
