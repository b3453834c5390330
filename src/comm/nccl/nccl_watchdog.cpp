#include "nccl_watchdog.hpp"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"

namespace ddp::nccl_detail {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

NcclWatchdog::NcclWatchdog(NcclCommunicator& communicator, int device, int rank, int size,
                           std::chrono::milliseconds interval, AbortFn abort, RoundFn on_round)
    : communicator_(communicator),
      device_(device),
      rank_(rank),
      size_(size),
      interval_(interval),
      abort_(std::move(abort)),
      on_round_(std::move(on_round)),
      thread_([this] { run(); }) {}

NcclWatchdog::~NcclWatchdog() {
  {
    std::lock_guard<std::mutex> guard(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void NcclWatchdog::watch(CollectiveStatePtr state) {
  std::lock_guard<std::mutex> guard(mutex_);
  pending_.push_back(std::move(state));
}

void NcclWatchdog::fail_all(const std::string& reason) {
  std::deque<CollectiveStatePtr> failing;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    failing.swap(pending_);
  }
  for (auto& state : failing) {
    state->fail(std::make_exception_ptr(
        CollectiveError(fmt::format("nccl backend: rank {} of {}: {} (sequence {}) failed: {}",
                                    rank_, size_, state->description, state->sequence, reason))));
  }
}

void NcclWatchdog::fail_all(std::exception_ptr error) {
  std::deque<CollectiveStatePtr> failing;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    failing.swap(pending_);
  }
  for (auto& state : failing) state->fail(error);
}

void NcclWatchdog::run() {
  // Events and NCCL calls belong to the group's device.
  cudaSetDevice(device_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_) {
    wake_.wait_until(lock, deadline_after(interval_), [this] { return stop_; });
    if (stop_) continue;
    lock.unlock();
    if (on_round_) on_round_();
    if (communicator_.aborted()) {
      lock.lock();
      continue;
    }
    const std::string reason = check();
    if (!reason.empty()) {
      // Also logged: in the default non-blocking mode a failure surfaces only at the next
      // operation on the group, and an application that issues none would never see it.
      ddp::log::get("ddp.nccl")->error("{}", reason);
      abort_(reason);
      fail_all(reason);
    }
    lock.lock();
  }
}

std::string NcclWatchdog::check() {
  std::deque<CollectiveStatePtr> snapshot;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    snapshot = pending_;
  }
  const ncclResult_t async = communicator_.async_error();
  if (async != ncclSuccess && async != ncclInProgress) {
    // Names the oldest collective not yet seen complete: the one the error most likely hit.
    std::string pending = "no collective was pending";
    for (auto& state : snapshot) {
      if (!state->query()) {
        pending = fmt::format("oldest pending collective: {} (sequence {})", state->description,
                              state->sequence);
        break;
      }
    }
    return fmt::format(
        "nccl backend: rank {} of {}: NCCL reported an asynchronous error: {} ({}); the "
        "communicator was aborted (a peer may have died or the network failed; NCCL_DEBUG=INFO "
        "tells more)",
        rank_, size_, ncclGetErrorString(async), pending);
  }
  const auto now = Clock::now();
  size_t finished = 0;
  std::string reason;
  for (auto& state : snapshot) {
    if (state->query()) {
      ++finished;
      continue;
    }
    const auto elapsed = now - state->issued;
    if (elapsed > state->timeout) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count();
      reason = fmt::format(
          "nccl backend: rank {} of {}: {} (sequence {}) did not complete within {} ms "
          "(elapsed {} ms); the watchdog aborted the communicator. A rank has not joined the "
          "collective (crashed, hung, or issued a different one); check that every rank issues "
          "the same collectives in the same order",
          rank_, size_, state->description, state->sequence, state->timeout.count(), ms);
      state->fail(std::make_exception_ptr(CollectiveError(reason)));
      break;
    }
    // Collectives on one stream finish in order: later ones cannot have timed out earlier.
    break;
  }
  if (finished > 0) {
    std::lock_guard<std::mutex> guard(mutex_);
    // Only this thread removes entries, and watch() appends, so the first `finished` entries
    // are the ones found complete.
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<long>(finished));
  }
  return reason;
}

}  // namespace ddp::nccl_detail
