// keep_freed_memory(): freed blocks stay mapped, so allocating them again costs no page faults;
// the user's own malloc environment is respected.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cstdlib>
#include <vector>

#include "ddp/util/malloc_tuning.hpp"

namespace {

long minor_faults() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// One "training step": 8 blocks of 4 MiB (32 MiB, like a step's activations), each page
// written, then all freed. The writes are volatile: a compiler may otherwise remove a malloc,
// stores and free that nothing reads (clang does), and the step would fault no page at all.
void step() {
  constexpr size_t kBlock = 4 << 20;
  std::vector<char*> blocks;
  for (int i = 0; i < 8; ++i) {
    auto* p = static_cast<char*>(std::malloc(kBlock));
    ASSERT_NE(p, nullptr);
    volatile char* pages = p;
    for (size_t off = 0; off < kBlock; off += 4096) pages[off] = static_cast<char>(off);
    blocks.push_back(p);
  }
  for (char* p : blocks) std::free(p);
}

bool user_set_malloc_env() {
  for (const char* name :
       {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_", "GLIBC_TUNABLES"}) {
    if (std::getenv(name)) return true;
  }
  return false;
}

TEST(MallocTuning, RespectsTheUsersSettings) {
  if (user_set_malloc_env()) GTEST_SKIP() << "malloc settings already in this test's environment";
  ::setenv("MALLOC_TRIM_THRESHOLD_", "1000000", 1);
  EXPECT_FALSE(ddp::keep_freed_memory());
  ::unsetenv("MALLOC_TRIM_THRESHOLD_");
  ::setenv("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1000000", 1);
  EXPECT_FALSE(ddp::keep_freed_memory());
  ::unsetenv("GLIBC_TUNABLES");
}

TEST(MallocTuning, RepeatedStepsReuseMappedMemory) {
#if !defined(__GLIBC__)
  GTEST_SKIP() << "keep_freed_memory() only tunes glibc's malloc";
#endif
  if (user_set_malloc_env()) GTEST_SKIP() << "malloc settings already in this test's environment";
  ASSERT_TRUE(ddp::keep_freed_memory());
  step();  // the heap grows to the step's peak once
  const long before = minor_faults();
  for (int i = 0; i < 4; ++i) step();
  // With glibc's defaults every step faults its 8192 pages in again (32768 here).
  EXPECT_LT(minor_faults() - before, 1000);
}

}  // namespace
