#pragma once
// Element-wise reduction kernels shared by every backend (internal header).
//
// float16 and bfloat16 are accumulated in float32 and rounded once (round to nearest even),
// so a reduction over many ranks keeps float32 precision until the final store.

#include <cstddef>
#include <cstdint>

#include "ddp/comm/types.hpp"
#include "half_convert.hpp"

namespace ddp::detail {

// dst[i] = op(srcs[0][i], ..., srcs[nsrc-1][i]) for i < count, nsrc >= 1. For kAvg the sum is
// divided by `avg_divisor` (integers: truncating). dst may alias any source exactly (same
// address), never partially.
// `dst2`, when not null, receives a second copy of the result (saves a pass over memory when
// the result is needed in two places); it must not overlap any source.
void reduce_buffers(DataType dtype, ReduceOp op, void* dst, const void* const* srcs, size_t nsrc,
                    size_t count, int avg_divisor, void* dst2 = nullptr);

// dst[i] = op(dst[i], src[i]); kAvg accumulates as a sum (finish with divide_in_place).
void accumulate(DataType dtype, ReduceOp op, void* dst, const void* src, size_t count);

// data[i] /= divisor (integers: truncating).
void divide_in_place(DataType dtype, void* data, size_t count, int divisor);

}  // namespace ddp::detail
