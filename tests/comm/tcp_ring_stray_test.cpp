// TcpRing admits only its previous leader (issue 25, defect 11). A connection that reaches a
// leader's ring port before the real predecessor -- one that sends nothing, one that sends the
// old 8-byte rank header followed by payload-sized garbage, one that sends a well-framed hello
// without knowing the ring's secret -- is refused and closed by that leader, and the ring still
// forms and all-reduces every element correctly.
//
// The stray learns the port where the real peers do: the address the target leader publishes
// in the store ("<prefix>addr/<rank>"). The ordering is forced, not raced: the target leader
// starts alone (it publishes its address, then waits in the store for its successor's), the
// stray connects and sends, and only then do the other leaders start, so the stray is first in
// the target's accept queue. Every blocking call is bounded; no assertion is about time.

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "buffers.hpp"
#include "cpu/ring_auth.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"
#include "tcp_ring_util.hpp"

namespace ddp::test {
namespace {

using detail::TcpRing;
using std::chrono::milliseconds;

constexpr int kRanks = 3;
constexpr int kTarget = 1;  // the leader the stray connects to; its predecessor is rank 0
// Setup and call limit of the rings. Before the fix a silent stray held the target for this long.
constexpr milliseconds kTimeout(15000);
constexpr size_t kCount = 3000;  // float32 elements: blocks of 1000 on 3 ranks

// What rank kTarget receives from its predecessor in one all_reduce of kCount float32: two
// reduce-scatter and two all-gather blocks. A stray taken for the predecessor that sends this
// much garbage is reduced into the result instead of timing the call out.
constexpr size_t kGarbageBytes = 4 * (kCount / kRanks) * sizeof(float);

struct Endpoint {
  std::string host;
  uint16_t port = 0;
};

// The ring address `rank` published ("host port").
Endpoint published_address(Store& store, int rank) {
  const std::string key = "t/addr/" + std::to_string(rank);
  store.wait({key}, kTimeout);
  const std::string value = store.get(key);
  const auto space = value.rfind(' ');
  return {value.substr(0, space), static_cast<uint16_t>(std::stoul(value.substr(space + 1)))};
}

// Garbage that would be visible in any sum: float32 1e6 in every element.
std::string garbage() {
  std::string bytes(kGarbageBytes, '\0');
  const float big = 1e6f;
  for (size_t i = 0; i + sizeof(float) <= bytes.size(); i += sizeof(float)) {
    std::memcpy(bytes.data() + i, &big, sizeof(float));
  }
  return bytes;
}

struct RingsWithStray {
  std::vector<std::unique_ptr<TcpRing>> rings;  // null where construction threw
  std::vector<std::string> errors;              // one per rank, empty if none
  net::Socket stray;                            // still open: the test checks it was closed
  int secrets_left = -1;                        // ring secrets still in the store after the setup
};

// Starts rank kTarget, runs connect_stray(address of kTarget) on this thread, then starts the
// other ranks; returns once every rank's constructor has returned or thrown.
RingsWithStray rings_with_stray(const std::function<net::Socket(const Endpoint&)>& connect_stray) {
  HashStore store;
  RingsWithStray out;
  out.rings.resize(kRanks);
  out.errors.resize(kRanks);
  std::vector<int> ranks(kRanks);
  for (int r = 0; r < kRanks; ++r) ranks[r] = r;
  auto start = [&](int r) {
    return std::thread([&, r] {
      try {
        out.rings[r] = std::make_unique<TcpRing>(store, "t/", r, kRanks, kTimeout, ranks,
                                                 "ring rank " + std::to_string(r), "127.0.0.1");
      } catch (const std::exception& e) {
        out.errors[r] = e.what();
      }
    });
  };
  std::vector<std::thread> threads;
  threads.push_back(start(kTarget));
  try {
    out.stray = connect_stray(published_address(store, kTarget));
  } catch (const std::exception& e) {
    out.errors[kTarget] += std::string("(the test's stray connection failed: ") + e.what() + ")";
  }
  for (int r = 0; r < kRanks; ++r) {
    if (r != kTarget) threads.push_back(start(r));
  }
  for (auto& t : threads) t.join();
  out.secrets_left = 0;
  for (int r = 0; r < kRanks; ++r)
    out.secrets_left += store.check({"t/secret/" + std::to_string(r)});
  return out;
}

net::Socket connect_and_send(const Endpoint& at, const std::string& bytes) {
  const auto deadline = deadline_after(kTimeout);
  net::Socket s = net::connect_tcp(at.host, at.port, deadline);
  if (!bytes.empty()) net::write_all(s.fd(), bytes.data(), bytes.size(), deadline, "the ring");
  return s;
}

// Every rank formed its ring, a float32 sum over all of them is right in every element, and
// the target closed the stray's connection.
void expect_ring_works_and_stray_closed(RingsWithStray& w) {
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(w.errors[r], "") << "rank " << r << " did not form its ring";
  }
  EXPECT_EQ(w.secrets_left, 0) << "a leader left its ring secret in the store";
  std::vector<std::vector<uint8_t>> bufs(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    bufs[r] = make_input(DataType::kFloat32, kCount, r, ReduceOp::kSum);
    threads.emplace_back([&, r] {
      try {
        w.rings[r]->all_reduce(bufs[r].data(), kCount, DataType::kFloat32, ReduceOp::kSum,
                               call_for(DataType::kFloat32, ReduceOp::kSum, kCount));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(errors[r], "") << "rank " << r << "'s all_reduce failed";
    size_t wrong = 0;
    std::string first;
    for (size_t i = 0; i < kCount; ++i) {
      const double want = expected_reduction(DataType::kFloat32, ReduceOp::kSum, kRanks, i);
      const double got = get(DataType::kFloat32, bufs[r].data(), i);
      if (got != want && wrong++ == 0) {
        first = "index " + std::to_string(i) + " holds " + std::to_string(got) + ", expected " +
                std::to_string(want);
      }
    }
    EXPECT_EQ(wrong, 0u) << "rank " << r << ": " << wrong << " of " << kCount
                         << " elements are wrong; the first: " << first;
  }
  // The target closed the stray: it reads end of file (or a reset, when the target left unread
  // bytes behind), not more waiting. Bounded by kTimeout.
  ASSERT_TRUE(w.stray.valid());
  pollfd p{w.stray.fd(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, static_cast<int>(kTimeout.count())), 1)
      << "the target leader never closed the stray connection";
  char drain[4096];
  ssize_t n;
  while ((n = ::recv(w.stray.fd(), drain, sizeof(drain), MSG_DONTWAIT)) > 0) {
  }
  EXPECT_TRUE(n == 0 || errno == ECONNRESET) << "recv: " << std::strerror(errno);
}

TEST(TcpRingStray, SilentConnectionFirstDoesNotStopTheRing) {
  auto w = rings_with_stray([](const Endpoint& at) { return connect_and_send(at, ""); });
  expect_ring_works_and_stray_closed(w);
}

// The previous protocol's hello was the predecessor's ring rank as 8 bytes; anyone who sent it
// was taken for the predecessor and the garbage after it was summed into every rank's result.
TEST(TcpRingStray, OldRankHeaderAndGarbageAreRefused) {
  auto w = rings_with_stray([](const Endpoint& at) {
    const int64_t predecessor = kTarget - 1;
    std::string bytes(reinterpret_cast<const char*>(&predecessor), sizeof(predecessor));
    return connect_and_send(at, bytes + garbage());
  });
  expect_ring_works_and_stray_closed(w);
}

// A hello in the current framing ("ddpring1", the predecessor's rank, 32 proof bytes) whose
// proof was not made with the target's secret.
TEST(TcpRingStray, HelloWithAForgedProofIsRefused) {
  auto w = rings_with_stray([](const Endpoint& at) {
    std::string hello = "ddpring1";
    hello += std::string("\0\0\0", 3) + static_cast<char>(kTarget - 1);  // big-endian rank
    hello += std::string(32, '\xab');
    return connect_and_send(at, hello + garbage());
  });
  expect_ring_works_and_stray_closed(w);
}

// Error path: when the predecessor never proves itself, the setup's TimeoutError names it and
// the connections that were refused meanwhile. The test plays rank 0 through the store (its
// address is a listener of the test, its secret one the test chose) and never connects; it
// checks that rank 1's own hello to "rank 0" is valid, and sends rank 1 a garbage hello.
TEST(TcpRingStray, PredecessorThatNeverComesIsATimeoutNamingTheRefusals) {
  HashStore store;
  const auto deadline = deadline_after(kTimeout);
  net::Socket fake_rank0 = net::listen_tcp("127.0.0.1", 0, 4);
  const std::string secret0 = detail::ring_auth::make_secret_hex();
  store.set("t/secret/0", secret0);
  store.set("t/addr/0", "127.0.0.1 " + std::to_string(net::local_port(fake_rank0.fd())));
  std::string error;
  std::thread rank1([&] {
    try {
      // Short: this test waits for the whole setup limit.
      TcpRing ring(store, "t/", 1, 2, milliseconds(3000), {0, 1}, "ring rank 1", "127.0.0.1");
    } catch (const TimeoutError& e) {
      error = e.what();
    } catch (const std::exception& e) {
      error = std::string("not a TimeoutError: ") + e.what();
    }
  });
  std::string hello(detail::ring_auth::kHelloBytes, '\0');
  std::string accept_error;
  try {
    pollfd p{fake_rank0.fd(), POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(kTimeout.count())) != 1) throw std::runtime_error("poll");
    net::Socket from1(::accept(fake_rank0.fd(), nullptr, nullptr));
    net::read_exact(from1.fd(), hello.data(), hello.size(), deadline, "rank 1");
    net::Socket stray = connect_and_send(published_address(store, 1), std::string(44, 'x'));
    rank1.join();
  } catch (const std::exception& e) {
    accept_error = e.what();
    rank1.join();
  }
  ASSERT_EQ(accept_error, "");
  EXPECT_EQ(detail::ring_auth::check_hello(hello, secret0, 1, 0), "");
  EXPECT_NE(error.find("ring rank 1: rank 0 did not connect to this rank's ring port"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("refused 1 other connection(s) to that port, the last from 127.0.0.1:"),
            std::string::npos)
      << error;
  EXPECT_NE(error.find("not a ring hello"), std::string::npos) << error;
}

}  // namespace
}  // namespace ddp::test
