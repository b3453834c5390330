#pragma once
// Waiting on a 32-bit counter in shared memory (internal header): spin briefly (polling, and
// yielding the CPU every few microseconds so a peer sharing it still runs), then sleep in
// futex(2), always bounded by a deadline. Counters only grow (modulo 2^32); "reached" means
// the signed distance to the target is >= 0, so wrap-around is harmless.
//
// Wake-ups are cheap when nobody sleeps: a sleeper registers in `waiters` before sleeping and
// re-checks the counter, a writer stores the counter and calls futex only when waiters > 0.
// Both use sequentially consistent operations, so a wake-up cannot be lost.

#include <atomic>
#include <chrono>
#include <cstdint>

namespace ddp::detail {

using Clock = std::chrono::steady_clock;

inline bool reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

// Waits until *word reaches target, spinning at most `spin` first. Returns false when the
// deadline passed first, or when `cancel` (optional) turned true: it is read between sleeps,
// which last at most 100 ms (wake_sleepers ends one early). `slept` (optional) tells whether the
// spin ran out.
bool wait_reached(std::atomic<uint32_t>* word, uint32_t target, std::atomic<uint32_t>* waiters,
                  Clock::time_point deadline, std::chrono::microseconds spin, bool* slept = nullptr,
                  const std::atomic<bool>* cancel = nullptr);

// Stores value into *word and wakes its sleepers.
void publish(std::atomic<uint32_t>* word, uint32_t value, std::atomic<uint32_t>* waiters);

// Wakes every sleeper on *word without changing it: they re-read `cancel` at once (those that
// have nothing to end sleep again). One that checked `cancel` but has not yet gone to sleep
// still sleeps out its slice.
void wake_sleepers(std::atomic<uint32_t>* word);

}  // namespace ddp::detail
