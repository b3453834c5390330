// The MPI backend reached through ddp_comm's init_process_group, the way applications create
// it: rank and size come from MPI, and the group works like the one made directly.

#include <gtest/gtest.h>

#include "ddp/comm/init.hpp"
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

}  // namespace
}  // namespace ddp::test
