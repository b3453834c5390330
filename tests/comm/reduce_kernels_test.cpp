// Half-precision conversions (round to nearest even, subnormals, inf, nan) and float32
// accumulation of float16/bfloat16 reductions, locally and across ranks.

#include "reduce_kernels.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>

#include "buffers.hpp"
#include "rank_threads.hpp"

namespace ddp::detail {
namespace {

TEST(HalfConversion, KnownValuesRoundTrip) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);               // largest finite
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);               // rounds to inf
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_half(std::ldexp(1.0f, -26)), 0x0000);  // below half of it
  EXPECT_EQ(float_to_half(2049.0f), 0x6800);                // tie -> even (2048)
  EXPECT_EQ(float_to_half(2051.0f), 0x6802);                // tie -> even (2052)
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(std::nanf("")))));
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(0xfc00), -std::numeric_limits<float>::infinity());
  for (uint32_t h = 0; h < 0x10000; ++h) {
    if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0) continue;  // nan payloads
    ASSERT_EQ(float_to_half(half_to_float(static_cast<uint16_t>(h))), h) << std::hex << h;
  }
}

TEST(BFloat16Conversion, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(bfloat16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(float_to_bfloat16(257.0f), 0x4380);  // 256.0: tie to even
  EXPECT_EQ(float_to_bfloat16(259.0f), 0x4382);  // 260.0: tie to even
  EXPECT_TRUE(std::isnan(bfloat16_to_float(float_to_bfloat16(std::nanf("")))));
}

// The bulk conversions (F16C on x86-64 CPUs that have it) give the scalar conversions' bits for
// every float16 value and for float32 values spread over the whole bit range, the rounding
// ties and the subnormal boundaries included; a NaN stays a NaN. Odd lengths cover the tails.
TEST(HalfConversion, BulkConversionsMatchTheScalarOnes) {
  std::cout << "bulk float16 conversions use F16C: "
            << (half_conversions_use_f16c() ? "yes" : "no (scalar path)") << "\n";
  std::vector<uint16_t> halves(0x10000 + 5);
  for (size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(i * 7919u);
  std::vector<float> widened(halves.size());
  halves_to_floats(halves.data(), widened.data(), halves.size());
  for (size_t i = 0; i < halves.size(); ++i) {
    const float expected = half_to_float(halves[i]);
    if (std::isnan(expected)) {
      ASSERT_TRUE(std::isnan(widened[i])) << std::hex << halves[i];
    } else {
      ASSERT_EQ(std::memcmp(&widened[i], &expected, 4), 0) << std::hex << halves[i];
    }
  }
  std::vector<float> floats;
  for (uint64_t bits = 0; bits < (uint64_t{1} << 32); bits += 65521) {
    uint32_t b = static_cast<uint32_t>(bits);
    float f;
    std::memcpy(&f, &b, 4);
    floats.push_back(f);
  }
  for (float f : {2049.0f, 2051.0f, 65504.0f, 65519.0f, 65520.0f, std::ldexp(1.0f, -24),
                  std::ldexp(1.0f, -25), std::ldexp(3.0f, -26), std::ldexp(1.0f, -14),
                  std::ldexp(1023.5f, -24), -0.0f, std::numeric_limits<float>::infinity(),
                  std::numeric_limits<float>::denorm_min()}) {
    floats.push_back(f);
    floats.push_back(-f);
  }
  for (const float h : widened) floats.push_back(std::nextafter(h, 0.0f));  // just under ties
  std::vector<uint16_t> narrowed(floats.size());
  floats_to_halves(floats.data(), narrowed.data(), floats.size());
  for (size_t i = 0; i < floats.size(); ++i) {
    const uint16_t expected = float_to_half(floats[i]);
    if (std::isnan(floats[i])) {
      ASSERT_TRUE(std::isnan(half_to_float(narrowed[i]))) << floats[i];
    } else {
      ASSERT_EQ(narrowed[i], expected) << std::hexfloat << floats[i];
    }
  }
}

TEST(ReduceBuffers, HalfAccumulatesInFloat32) {
  // 2048 + 1 + ... + 1 (7 ones): float16 accumulation would stay at 2048 after every step;
  // float32 accumulation gives 2055, which rounds once to 2056.
  std::vector<uint16_t> bufs(8);
  std::vector<const void*> srcs;
  bufs[0] = float_to_half(2048.0f);
  for (int i = 1; i < 8; ++i) bufs[i] = float_to_half(1.0f);
  for (auto& b : bufs) srcs.push_back(&b);
  uint16_t out = 0;
  reduce_buffers(DataType::kFloat16, ReduceOp::kSum, &out, srcs.data(), srcs.size(), 1, 8);
  EXPECT_EQ(half_to_float(out), 2056.0f);
}

class HalfPrecisionAcrossRanks : public ::testing::TestWithParam<std::string> {};

TEST_P(HalfPrecisionAcrossRanks, SumKeepsFloat32Precision) {
  test::run_ranks(8, test::thread_options(GetParam()), [](ProcessGroup& pg) {
    for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
      // bfloat16 spacing at 256 is 2: 256 + 7 x 1 = 263 rounds once to 264.
      const float big = t == DataType::kFloat16 ? 2048.0f : 256.0f;
      const float expect = t == DataType::kFloat16 ? 2056.0f : 264.0f;
      std::vector<uint16_t> buf(100000);
      for (auto& v : buf) {
        const float x = pg.rank() == 0 ? big : 1.0f;
        v = t == DataType::kFloat16 ? float_to_half(x) : float_to_bfloat16(x);
      }
      pg.all_reduce(buf.data(), buf.size(), t, ReduceOp::kSum)->wait(std::chrono::seconds(60));
      for (uint16_t v : buf) {
        ASSERT_EQ(t == DataType::kFloat16 ? half_to_float(v) : bfloat16_to_float(v), expect)
            << to_string(t);
      }
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Comm, HalfPrecisionAcrossRanks, ::testing::Values("cpu", "gloo"));

}  // namespace
}  // namespace ddp::detail
