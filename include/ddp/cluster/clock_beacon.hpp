#pragma once
// A clock the doctor can read through the store: the beacon writes this machine's wall-clock
// time (Unix milliseconds) to kClockKey every kPeriod. A doctor on another node reads it and
// estimates the skew as value - midpoint(send, receive), uncertain by half the round trip
// plus kPeriod.
//
// `ddp-doctor --serve HOST:PORT` runs a TcpStore server with a beacon on the master, so
// `ddp-doctor --endpoint HOST:PORT` on every other node tests reachability, auth and clocks
// before any training is launched.

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>

namespace ddp {
class Store;
}

namespace ddp::cluster {

class ClockBeacon {
 public:
  static constexpr const char* kClockKey = "ddp-doctor/clock";
  static constexpr std::chrono::milliseconds kPeriod{20};

  // Publishes the clock once (before returning), then from a background thread. The store
  // must outlive the beacon. A later store error stops publishing (readers then see a stale
  // value and skip).
  explicit ClockBeacon(std::shared_ptr<Store> store);
  ~ClockBeacon();  // stops and joins
  ClockBeacon(const ClockBeacon&) = delete;
  ClockBeacon& operator=(const ClockBeacon&) = delete;

  // Unix time in milliseconds from the system (wall) clock.
  static int64_t wall_ms();

 private:
  std::shared_ptr<Store> store_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace ddp::cluster
