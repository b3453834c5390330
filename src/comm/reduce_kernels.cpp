#include "reduce_kernels.hpp"

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "ddp/util/error.hpp"

namespace ddp::detail {

namespace {

// Storage type S is loaded into accumulator type A and stored back.
template <typename S, typename A>
struct Native {
  using Storage = S;
  using Acc = A;
  static A load(S v) { return static_cast<A>(v); }
  static S store(A v) { return static_cast<S>(v); }
};
// The half types convert a block at a time (the bulk conversions vectorise).
struct Half {
  using Storage = uint16_t;
  using Acc = float;
  static void load_block(const uint16_t* in, float* out, size_t n) { halves_to_floats(in, out, n); }
  static void store_block(const float* in, uint16_t* out, size_t n) {
    floats_to_halves(in, out, n);
  }
};
struct BFloat {
  using Storage = uint16_t;
  using Acc = float;
  static void load_block(const uint16_t* in, float* out, size_t n) {
    bfloat16s_to_floats(in, out, n);
  }
  static void store_block(const float* in, uint16_t* out, size_t n) {
    floats_to_bfloat16s(in, out, n);
  }
};

template <typename Tr>
constexpr bool kConvertsByBlock = !std::is_same_v<typename Tr::Storage, typename Tr::Acc> &&
                                  std::is_same_v<typename Tr::Storage, uint16_t>;

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
    if constexpr (kConvertsByBlock<Tr>) {
      Tr::load_block(s0, acc, n);
    } else {
      for (size_t i = 0; i < n; ++i) acc[i] = Tr::load(s0[i]);
    }
    for (size_t k = 1; k < nsrc; ++k) {
      const S* sk = static_cast<const S*>(srcs[k]) + base;
      if constexpr (kConvertsByBlock<Tr>) {
        A widened[kBlock];
        Tr::load_block(sk, widened, n);
        for (size_t i = 0; i < n; ++i) acc[i] = f(acc[i], widened[i]);
      } else {
        for (size_t i = 0; i < n; ++i) acc[i] = f(acc[i], Tr::load(sk[i]));
      }
    }
    if (avg_divisor > 0) {
      const A d = static_cast<A>(avg_divisor);
      for (size_t i = 0; i < n; ++i) acc[i] = acc[i] / d;
    }
    S* out = dst + base;
    if constexpr (kConvertsByBlock<Tr>) {
      Tr::store_block(acc, out, n);
    } else {
      for (size_t i = 0; i < n; ++i) out[i] = Tr::store(acc[i]);
    }
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
