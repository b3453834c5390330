#pragma once
// Small helpers over Store for the rendezvous. Internal to src/rendezvous.

#include <algorithm>
#include <chrono>
#include <string>
#include <vector>

#include "ddp/rendezvous/options.hpp"
#include "ddp/store/store.hpp"
#include "ddp/util/error.hpp"

namespace ddp::rdzv {

// Time left until deadline, at least 1 ms (a zero wait would be "no limit" to some stores).
inline Millis remaining(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
  return std::max(left, Millis(1));
}

// Waits for every key; false on timeout. Network and store failures propagate.
inline bool wait_for_keys(Store& store, const std::vector<std::string>& keys, Millis limit) {
  try {
    store.wait(keys, limit);
    return true;
  } catch (const TimeoutError&) {
    return false;
  }
}

}  // namespace ddp::rdzv
