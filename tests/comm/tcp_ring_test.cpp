// TcpRing (the cpu backend's all_reduce among host leaders), ranks as threads over loopback:
// every dtype, odd sizes (blocks of one element and empty blocks), several ops, against a
// reference; and a peer that vanishes mid-collective is a NetworkError naming it, not a hang.

#include "cpu/tcp_ring.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "buffers.hpp"
#include "ddp/util/error.hpp"
#include "tcp_ring_util.hpp"

namespace ddp::test {
namespace {

using std::chrono::milliseconds;

TEST(TcpRing, AllReduceMatchesReferenceForOddSizesDtypesOps) {
  for (int n : {2, 3}) {
    auto rings = make_rings(n, milliseconds(20000));
    for (DataType t : kAllDtypes) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax, ReduceOp::kMin}) {
        for (size_t count : {size_t{1}, size_t{2}, size_t{5}, size_t{100003}}) {
          std::vector<std::vector<uint8_t>> bufs(n);
          std::vector<std::thread> threads;
          for (int r = 0; r < n; ++r) {
            bufs[r] = make_input(t, count, r, op);
            threads.emplace_back([&, r] {
              rings[r]->all_reduce(bufs[r].data(), count, t, op, call_for(t, op, count));
            });
          }
          for (auto& th : threads) th.join();
          for (int r = 0; r < n; ++r) {
            for (size_t i = 0; i < count; ++i) {
              ASSERT_EQ(get(t, bufs[r].data(), i), expected_reduction(t, op, n, i))
                  << "n " << n << " " << to_string(t) << " " << to_string(op) << " count " << count
                  << " rank " << r << " i " << i;
            }
          }
        }
      }
    }
  }
}

// Buffers far larger than the sockets' buffers (sends and receives interleave over many calls)
// on rings of 2 to 4 ranks, several calls in a row: every rank ends with the reference result
// in every element.
TEST(TcpRing, LargeBuffersOnRingsOfTwoToFourRanks) {
  for (int n : {2, 3, 4}) {
    auto rings = make_rings(n, milliseconds(60000));
    for (DataType t : {DataType::kFloat32, DataType::kFloat16}) {
      for (size_t count : {size_t{3} << 20, (size_t{1} << 20) + 7}) {
        std::vector<std::vector<uint8_t>> bufs(n);
        std::vector<std::thread> threads;
        for (int r = 0; r < n; ++r) {
          bufs[r] = make_input(t, count, r, ReduceOp::kSum);
          threads.emplace_back([&, r] {
            rings[r]->all_reduce(bufs[r].data(), count, t, ReduceOp::kSum,
                                 call_for(t, ReduceOp::kSum, count));
          });
        }
        for (auto& th : threads) th.join();
        for (int r = 0; r < n; ++r) {
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(get(t, bufs[r].data(), i), expected_reduction(t, ReduceOp::kSum, n, i))
                << "n " << n << " " << to_string(t) << " count " << count << " rank " << r << " i "
                << i;
          }
        }
      }
    }
  }
}

// A compression hook hands the ring float16 so that half the bytes cross the link: the ring must
// send them as they are, not widened to float32, and every element of every rank must hold the
// sum. The expected sums are computed here in double from the inputs (integers up to 15, exact
// in float16 and bfloat16), not by the library's reduction, so a mis-rounded, dropped or stale
// element anywhere in the buffer fails.
TEST(TcpRing, HalfTypesTravelAtTwoBytesPerElement) {
  constexpr int n = 3;
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
    auto rings = make_rings(n, milliseconds(20000));
    const size_t count = 30000;
    std::vector<std::vector<uint8_t>> bufs(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      bufs[r] = make_input(t, count, r, ReduceOp::kSum);
      threads.emplace_back([&, r] {
        rings[r]->all_reduce(bufs[r].data(), count, t, ReduceOp::kSum,
                             call_for(t, ReduceOp::kSum, count));
      });
    }
    for (auto& th : threads) th.join();
    for (int r = 0; r < n; ++r) {
      // 2 (n-1)/n of the buffer: every block but one, twice (reduce-scatter, all-gather).
      EXPECT_EQ(rings[r]->bytes_sent(), 2u * (2 * count / 3) * 2) << to_string(t) << " rank " << r;
      size_t wrong = 0;
      std::string first;  // the first wrong element, for the message
      for (size_t i = 0; i < count; ++i) {
        double sum = 0;
        for (int q = 0; q < n; ++q) sum += input_value(q, i, ReduceOp::kSum);
        const double got = get(t, bufs[r].data(), i);
        if (got != sum && wrong++ == 0) {
          first = "index " + std::to_string(i) + " holds " + std::to_string(got) + ", expected " +
                  std::to_string(sum);
        }
      }
      EXPECT_EQ(wrong, 0u) << to_string(t) << " rank " << r << ": " << wrong << " of " << count
                           << " elements differ from the sum; the first: " << first;
    }
  }
}

TEST(TcpRing, PeerThatVanishesIsANetworkErrorNamingIt) {
  auto rings = make_rings(2, milliseconds(20000));
  rings[1].reset();  // closes both of its connections
  std::vector<float> x(1000, 1.0f);
  try {
    rings[0]->all_reduce(x.data(), x.size(), DataType::kFloat32, ReduceOp::kSum,
                         call_for(DataType::kFloat32, ReduceOp::kSum, x.size()));
    FAIL() << "expected a NetworkError";
  } catch (const NetworkError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 at 127.0.0.1:"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ddp::test
