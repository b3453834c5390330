#include "dump_request_watcher.hpp"

#include "ddp/comm/flight_recorder.hpp"

namespace ddp::mpi_detail {

DumpRequestWatcher::DumpRequestWatcher(std::function<void()> dump) : dump_(std::move(dump)) {
  FlightRecorder::install_dump_signal_handler();
  const uint64_t seen = FlightRecorder::dump_signals_received();
  thread_ = std::thread([this, seen] { loop(seen); });
}

DumpRequestWatcher::~DumpRequestWatcher() {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void DumpRequestWatcher::loop(uint64_t signals_seen) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!cv_.wait_for(lock, kInterval, [this] { return stop_; })) {
    if (FlightRecorder::dump_signals_received() != signals_seen) {
      lock.unlock();
      dump_();  // once: a group writes its record at most once
      return;
    }
  }
}

}  // namespace ddp::mpi_detail
