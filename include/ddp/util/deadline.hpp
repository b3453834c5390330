#pragma once
// Saturating deadline arithmetic.
//
// Callers pass "no limit" as std::chrono::milliseconds::max() (or any huge duration).
// `now + timeout` then overflows steady_clock's int64 nanoseconds: the deadline lands in the
// past (an immediate TimeoutError) or the behaviour is undefined (condition_variable::wait_for
// with max()). Every deadline in the library is computed here instead: a duration is clamped
// to [0, kMaxWait] before it is added, so "forever" means "about a year" and never wraps.
#include <algorithm>
#include <chrono>
#include <cstdint>

namespace ddp {

// The longest wait a deadline can express; longer durations (max()) are clamped to it.
inline constexpr std::chrono::milliseconds kMaxWait{int64_t{365} * 24 * 3600 * 1000};

// `timeout` clamped to [0, kMaxWait] as milliseconds, converting without overflow (a
// seconds::max() or nanoseconds::max() clamps instead of wrapping).
template <class Rep, class Period>
constexpr std::chrono::milliseconds clamp_wait(std::chrono::duration<Rep, Period> timeout) {
  using Seconds = std::chrono::duration<double>;
  if (timeout <= std::chrono::duration<Rep, Period>::zero()) return std::chrono::milliseconds{0};
  // Compare as floating-point seconds, which any duration converts to without overflow (an
  // integer conversion of hours::max() to milliseconds, or of kMaxWait to a narrow Rep, would
  // wrap).
  if (Seconds(timeout) >= Seconds(kMaxWait)) return kMaxWait;
  return std::min(std::chrono::ceil<std::chrono::milliseconds>(timeout), kMaxWait);
}

// now + timeout on the steady clock, saturating (see clamp_wait).
template <class Rep, class Period>
std::chrono::steady_clock::time_point deadline_after(
    std::chrono::duration<Rep, Period> timeout,
    std::chrono::steady_clock::time_point now = std::chrono::steady_clock::now()) {
  return now + clamp_wait(timeout);
}

// a + b for non-negative limits, saturating at kMaxWait ("limit plus a grace period" with an
// infinite limit stays infinite instead of overflowing to a negative duration).
constexpr std::chrono::milliseconds saturating_add(std::chrono::milliseconds a,
                                                   std::chrono::milliseconds b) {
  return clamp_wait(clamp_wait(a) + clamp_wait(b));
}

}  // namespace ddp
