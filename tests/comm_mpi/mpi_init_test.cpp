// The MPI backend reached through ddp_comm's init_process_group, the way applications create
// it: rank and size come from MPI, and the group works like the one made directly.

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <algorithm>
#include <sstream>

#include "ddp/comm/init.hpp"
#include "ddp/util/logging.hpp"
#include "mpi_world.hpp"

namespace ddp::test {
namespace {

TEST(MpiInit, InitProcessGroupBuildsAnMpiGroupOverTheWholeWorld) {
  InitOptions options;
  options.backend = "mpi";
  options.timeout = kTimeout;
  auto group = init_process_group(options);
  ASSERT_TRUE(group);  // every rank gets a group, so this ASSERT cannot desynchronise ranks
  EXPECT_EQ(group->backend_name(), "mpi");
  EXPECT_EQ(group->rank(), world().rank());
  EXPECT_EQ(group->size(), world().size());
  int64_t value = group->rank() + 1;
  group->all_reduce(&value, 1, DataType::kInt64, ReduceOp::kSum)->wait(kTimeout);
  const int64_t n = group->size();
  EXPECT_EQ(value, n * (n + 1) / 2);
}

// The fingerprint check is a cpu/gloo feature; asking for it with mpi is answered with a warning
// instead of silence, and the group still works.
TEST(MpiInit, DebugCollectivesSaysMpiCallsRunUnchecked) {
  auto logger = log::get("ddp.comm");
  std::ostringstream captured;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(captured);
  logger->sinks().push_back(sink);
  InitOptions options;
  options.backend = "mpi";
  options.timeout = kTimeout;
  options.debug_collectives = true;
  auto group = init_process_group(options);
  auto& sinks = logger->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
  ASSERT_TRUE(group);
  EXPECT_NE(captured.str().find("backend mpi does not compare collectives"), std::string::npos)
      << captured.str();
  int64_t value = 1;
  group->all_reduce(&value, 1, DataType::kInt64, ReduceOp::kSum)->wait(kTimeout);
  EXPECT_EQ(value, group->size());
}

}  // namespace
}  // namespace ddp::test
