// DDP_CPU_LEADER_TRANSPORT (docs/comm.md): the host leaders of the cpu backend all-reduce over
// ddp's TCP ring (default) or over Gloo; both give every rank the exact reduction across
// simulated hosts, and another value is a UsageError naming the variable.
#include <gtest/gtest.h>
#include <stdlib.h>

#include "buffers.hpp"
#include "ddp/comm/init.hpp"
#include "ddp/util/error.hpp"
#include "rank_threads.hpp"

namespace ddp::test {
namespace {

// Sets an environment variable for one test (every rank thread reads it at init).
class LeaderTransport : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override { ::setenv("DDP_CPU_LEADER_TRANSPORT", GetParam(), 1); }
  void TearDown() override { ::unsetenv("DDP_CPU_LEADER_TRANSPORT"); }
};

TEST_P(LeaderTransport, AllReduceAcrossSimulatedHostsIsExact) {
  // 5 ranks on 3 "hosts" (2 + 2 + 1): three leaders reduce between the hosts.
  auto customize = [](int rank, InitOptions& o) { o.host_id = "host" + std::to_string(rank / 2); };
  run_ranks(
      5, thread_options("cpu"),
      [](ProcessGroup& pg) {
        for (DataType t : {DataType::kFloat32, DataType::kInt64, DataType::kBFloat16}) {
          for (size_t count : {size_t{3}, size_t{300001}}) {
            auto buf = make_input(t, count, pg.rank(), ReduceOp::kSum);
            pg.all_reduce(buf.data(), count, t, ReduceOp::kSum)->wait(std::chrono::seconds(60));
            for (size_t i = 0; i < count; ++i) {
              ASSERT_EQ(get(t, buf.data(), i), expected_reduction(t, ReduceOp::kSum, 5, i))
                  << to_string(t) << " i " << i;
            }
          }
        }
      },
      customize);
}

INSTANTIATE_TEST_SUITE_P(RingAndGloo, LeaderTransport, ::testing::Values("ring", "gloo"));

TEST(LeaderTransportValue, AnUnknownValueIsAUsageErrorNamingTheVariable) {
  ::setenv("DDP_CPU_LEADER_TRANSPORT", "carrier-pigeon", 1);
  auto customize = [](int rank, InitOptions& o) { o.host_id = "host" + std::to_string(rank); };
  try {
    run_ranks(
        2, thread_options("cpu", std::chrono::seconds(10)), [](ProcessGroup&) {}, customize);
    ADD_FAILURE() << "an unknown leader transport was accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("DDP_CPU_LEADER_TRANSPORT=carrier-pigeon"),
              std::string::npos)
        << e.what();
  }
  ::unsetenv("DDP_CPU_LEADER_TRANSPORT");
}

}  // namespace
}  // namespace ddp::test
