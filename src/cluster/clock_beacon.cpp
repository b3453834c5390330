#include "ddp/cluster/clock_beacon.hpp"

#include <string>

#include "ddp/store/store.hpp"

namespace ddp::cluster {

ClockBeacon::ClockBeacon(std::shared_ptr<Store> store) : store_(std::move(store)) {
  // The first value is published before the constructor returns, so a reader that starts right
  // after the beacon always finds a clock (a store error here reaches the caller).
  store_->set(kClockKey, std::to_string(wall_ms()));
  thread_ = std::thread([this] {
    try {
      while (!stop_.load()) {
        store_->set(kClockKey, std::to_string(wall_ms()));
        std::this_thread::sleep_for(kPeriod);
      }
    } catch (const std::exception&) {
      // Publishing stops; readers notice the stale value (documented contract).
    }
  });
}

ClockBeacon::~ClockBeacon() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

int64_t ClockBeacon::wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace ddp::cluster
