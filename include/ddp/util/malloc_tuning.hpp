#pragma once
// keep_freed_memory(): stops glibc's malloc from giving a training loop's freed tensors back to
// the kernel after every step.
//
// Why: a step allocates and frees tens of MB of activations and gradients (the tutorials' CNN
// at batch 64: about 47 MB). With glibc's defaults the top of the heap is trimmed (brk) as soon
// as that much is free, so the next step faults every page back in, zero-filled: 11,500 page
// faults per step, 15-20 % of the step's CPU time on the 2-vCPU development VM, and memory
// bandwidth that the other rank on the machine needs. PyTorch processes have the same problem
// (8,000 faults per step for the same CNN) unless MALLOC_TRIM_THRESHOLD_ is set.
//
// What: mallopt(M_MMAP_THRESHOLD, 32 MiB) (glibc's maximum: blocks up to that size come from
// the heap instead of their own mmap) and mallopt(M_TRIM_THRESHOLD, 1 GiB) (the heap shrinks
// only when more than that is free at its top). Setting either turns off glibc's own dynamic
// threshold, which is why both are set.
// Cost: the process keeps its peak heap mapped (blocks above 32 MiB are still unmapped on free).
//
// Contract: call once, early in main. The user's own settings win: when MALLOC_TRIM_THRESHOLD_,
// MALLOC_MMAP_THRESHOLD_, MALLOC_TOP_PAD_ or a glibc.malloc GLIBC_TUNABLES entry is in the
// environment nothing is changed. Returns whether the settings were applied (always false with
// a C library other than glibc).
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace ddp {

inline bool keep_freed_memory() {
#if defined(__GLIBC__)
  for (const char* name : {"MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_"}) {
    if (std::getenv(name)) return false;
  }
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  if (tunables && std::strstr(tunables, "glibc.malloc.")) return false;
  constexpr int kMmapThreshold = 32 << 20;  // glibc rejects more (HEAP_MAX_SIZE / 2)
  constexpr int kTrimThreshold = 1 << 30;
  return mallopt(M_MMAP_THRESHOLD, kMmapThreshold) == 1 &&
         mallopt(M_TRIM_THRESHOLD, kTrimThreshold) == 1;
#else
  return false;
#endif
}

}  // namespace ddp
