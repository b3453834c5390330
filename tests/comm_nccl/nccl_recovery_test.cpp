// In-place recovery on the NCCL backend (issue 48; run on the accelerator machine, issue 52):
// notify_peer_lost aborts the non-blocking communicator and fails later calls with the
// PeerLostError itself, and a RecoverableGroup on nccl re-forms through forced generation
// changes, 100 times in one process, without growing its threads, descriptors or GPU memory.
// World 1: one GPU is all any machine of this project has. Skipped without a GPU.

#include <cuda_runtime_api.h>
#include <dirent.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <thread>

#include "../support/throws_with.hpp"
#include "ddp/comm/nccl_process_group.hpp"
#include "ddp/comm/recoverable_group.hpp"
#include "ddp/store/hash_store.hpp"
#include "ddp/store/recovery_notice.hpp"
#include "ddp/util/error.hpp"
#include "device_buffer.hpp"

namespace ddp::test {
namespace {

constexpr std::chrono::milliseconds kRecoveryTimeout{std::chrono::seconds(60)};

// Entries of a /proc folder of this process (its threads, its descriptors).
int count_entries(const char* dir) {
  DIR* d = ::opendir(dir);
  if (d == nullptr) return -1;
  int n = 0;
  while (const dirent* e = ::readdir(d)) n += e->d_name[0] != '.';
  ::closedir(d);
  return n;
}

size_t free_gpu_bytes() {
  size_t free = 0, total = 0;
  cuda_ok(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  return free;
}

using NcclRecovery = GpuTest;

TEST_F(NcclRecovery, NotifyPeerLostFailsEveryLaterCallWithThePeerLostError) {
  auto store = std::make_shared<HashStore>();
  auto pg = make_nccl_process_group(store, 0, 1, 0, kRecoveryTimeout);
  DeviceBuffer buffer(DataType::kFloat32, 16);
  pg->all_reduce(buffer.data(), 16, DataType::kFloat32, ReduceOp::kSum)->wait(kRecoveryTimeout);
  pg->notify_peer_lost(PeerLostError("rank 1 of 2 was lost (test)", 1, 1));
  EXPECT_TRUE(throws_with<PeerLostError>(
      [&] { pg->all_reduce(buffer.data(), 16, DataType::kFloat32, ReduceOp::kSum); },
      {"rank 1 of 2 was lost (test)"}));
  pg->notify_peer_lost(PeerLostError("a second cause", 2, 2));  // the first cause wins
  EXPECT_TRUE(
      throws_with<PeerLostError>([&] { pg->broadcast(buffer.data(), 16, DataType::kFloat32, 0); },
                                 {"rank 1 of 2 was lost (test)"}));
}

TEST_F(NcclRecovery, ARecoverableGroupReformsAHundredTimesWithoutGrowing) {
  auto store = std::make_shared<HashStore>();
  RecoverableGroupOptions o;
  o.backend = "nccl";
  o.rank = 0;
  o.world_size = 1;
  o.store = store;
  o.timeout = kRecoveryTimeout;
  o.watch_interval = std::chrono::milliseconds(10);
  RecoverableGroup group(o);
  DeviceBuffer buffer(DataType::kFloat32, 1024);
  auto one_step = [&] {
    group.group()
        ->all_reduce(buffer.data(), 1024, DataType::kFloat32, ReduceOp::kSum)
        ->wait(kRecoveryTimeout);
  };
  // One re-form first: what NCCL and CUDA allocate once per process is then in the baseline.
  auto force_generation = [&] {
    const int64_t g = recovery_notice::publish_lost_rank(*store, 0);
    while (!group.stale()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    group.reform();
    EXPECT_EQ(group.generation(), g);
  };
  one_step();
  force_generation();
  one_step();
  const int threads = count_entries("/proc/self/task");
  const int fds = count_entries("/proc/self/fd");
  const size_t free_before = free_gpu_bytes();
  for (int i = 0; i < 100; ++i) {
    force_generation();
    one_step();
  }
  EXPECT_LE(count_entries("/proc/self/task"), threads + 2) << "threads grew over 100 re-forms";
  EXPECT_LE(count_entries("/proc/self/fd"), fds + 2) << "descriptors grew over 100 re-forms";
  const size_t free_after = free_gpu_bytes();
  EXPECT_LE(free_before - std::min(free_before, free_after), size_t{64} << 20)
      << "GPU memory shrank by " << (free_before - free_after) / (1 << 20)
      << " MiB over 100 re-forms";
}

}  // namespace
}  // namespace ddp::test
