#pragma once
// float16 and bfloat16 <-> float32 conversions (internal header).
//
// All of them round to nearest even and handle subnormals, infinities and NaN. The bulk
// float16 conversions use the CPU's F16C instructions when it has them (every x86-64 CPU since
// 2012): a reduction of float16 buffers is otherwise bound by the conversions (about 2.5 ns per
// element with the scalar code, a tenth of that with F16C). Both paths give the same bits for
// every value except NaN payloads (a NaN stays a NaN).

#include <cstddef>
#include <cstdint>

namespace ddp::detail {

float half_to_float(uint16_t h);
uint16_t float_to_half(float f);
float bfloat16_to_float(uint16_t b);
uint16_t float_to_bfloat16(float f);

// out[i] = conversion of in[i] for i < n; in and out must not overlap.
void halves_to_floats(const uint16_t* in, float* out, size_t n);
void floats_to_halves(const float* in, uint16_t* out, size_t n);
void bfloat16s_to_floats(const uint16_t* in, float* out, size_t n);
void floats_to_bfloat16s(const float* in, uint16_t* out, size_t n);

// Whether the bulk float16 conversions use F16C on this CPU (tests say which path they ran).
bool half_conversions_use_f16c();

}  // namespace ddp::detail
