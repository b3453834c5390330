// TcpRing (the cpu backend's all_reduce among host leaders), ranks as threads over loopback:
// every dtype, odd sizes (blocks of one element and empty blocks), several ops, against a
// reference; and a peer that vanishes mid-collective is a NetworkError naming it, not a hang.

#include "cpu/tcp_ring.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "buffers.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/util/error.hpp"

namespace ddp::test {
namespace {

using detail::CallInfo;
using detail::OpKind;
using detail::TcpRing;
using std::chrono::milliseconds;

CallInfo call_for(DataType t, ReduceOp op, size_t count) {
  return CallInfo{OpKind::kAllReduce, t, op, true, -1, 0, count, 0, 1};
}

std::vector<std::unique_ptr<TcpRing>> make_rings(int n, milliseconds timeout) {
  HashStore store;
  std::vector<std::unique_ptr<TcpRing>> rings(n);
  std::vector<std::thread> threads;
  std::vector<int> ranks(n);
  for (int r = 0; r < n; ++r) ranks[r] = r;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      rings[r] = std::make_unique<TcpRing>(store, "t/", r, n, timeout, ranks,
                                           "ring rank " + std::to_string(r), "127.0.0.1");
    });
  }
  for (auto& t : threads) t.join();
  return rings;
}

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
// send them as they are, not widened to float32.
TEST(TcpRing, HalfTypesTravelAtTwoBytesPerElement) {
  for (DataType t : {DataType::kFloat16, DataType::kBFloat16}) {
    auto rings = make_rings(3, milliseconds(20000));
    const size_t count = 30000;
    std::vector<std::vector<uint8_t>> bufs(3);
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r) {
      bufs[r] = make_input(t, count, r, ReduceOp::kSum);
      threads.emplace_back([&, r] {
        rings[r]->all_reduce(bufs[r].data(), count, t, ReduceOp::kSum,
                             call_for(t, ReduceOp::kSum, count));
      });
    }
    for (auto& th : threads) th.join();
    for (int r = 0; r < 3; ++r) {
      // 2 (n-1)/n of the buffer: every block but one, twice (reduce-scatter, all-gather).
      EXPECT_EQ(rings[r]->bytes_sent(), 2u * (2 * count / 3) * 2) << to_string(t) << " rank " << r;
      EXPECT_EQ(get(t, bufs[r].data(), count - 1),
                expected_reduction(t, ReduceOp::kSum, 3, count - 1));
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
