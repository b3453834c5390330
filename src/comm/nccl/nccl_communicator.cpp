#include "nccl_communicator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"

namespace ddp::nccl_detail {
namespace {

using Clock = std::chrono::steady_clock;

std::string describe(ncclResult_t result, ncclComm_t comm) {
  std::string text = ncclGetErrorString(result);
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  if (last != nullptr && *last != '\0') text += fmt::format(" ({})", last);
  return text;
}

}  // namespace

NcclCommunicator::NcclCommunicator(const ncclUniqueId& id, int rank, int size,
                                   std::chrono::milliseconds timeout,
                                   const std::function<void()>& interrupt)
    : rank_(rank), size_(size), timeout_(timeout) {
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; wait_ready bounds the wait
  const ncclResult_t result = ncclCommInitRankConfig(&comm_, size, id, rank, &config);
  if (result != ncclSuccess && result != ncclInProgress) {
    if (comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw CollectiveError(
        fmt::format("nccl backend: rank {} of {}: ncclCommInitRankConfig failed: {}", rank, size,
                    describe(result, nullptr)));
  }
  try {
    wait_ready(fmt::format("joining the {}-rank NCCL communicator", size), interrupt);
  } catch (...) {
    if (!aborted_.exchange(true) && comm_ != nullptr) ncclCommAbort(comm_);
    comm_ = nullptr;
    throw;
  }
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_ == nullptr || aborted_.load()) return;
  // Finalize flushes outstanding operations; a peer that died makes it hang, so the wait is
  // bounded by the timeout and falls back to abort.
  ncclResult_t state = ncclCommFinalize(comm_);
  const auto deadline = deadline_after(timeout_);
  while (state == ncclInProgress && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
    if (result != ncclSuccess) state = result;
  }
  if (state != ncclSuccess) {
    ncclCommAbort(comm_);
    return;
  }
  ncclCommDestroy(comm_);
}

void NcclCommunicator::check(ncclResult_t result, const std::string& what) {
  if (result == ncclSuccess) return;
  if (result == ncclInProgress) return wait_ready(what);
  throw CollectiveError(fmt::format("nccl backend: rank {} of {}: {} failed: {}", rank_, size_,
                                    what, describe(result, comm_)));
}

void NcclCommunicator::wait_ready(const std::string& what, const std::function<void()>& interrupt) {
  const auto start = Clock::now();
  auto nap = std::chrono::microseconds(1);
  for (;;) {
    throw_if_aborting();
    if (interrupt) interrupt();  // the caller (the constructor) aborts on what it throws
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
    if (result != ncclSuccess) state = result;
    if (state == ncclSuccess) return;
    if (state != ncclInProgress) {
      throw CollectiveError(fmt::format("nccl backend: rank {} of {}: {} failed: {}", rank_, size_,
                                        what, describe(state, comm_)));
    }
    const auto elapsed = Clock::now() - start;
    if (elapsed >= timeout_) {
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count();
      const std::string reason = fmt::format(
          "nccl backend: rank {} of {}: {} did not finish within {} ms (waited {} ms): a rank "
          "has not joined (crashed, hung, or on a different collective); the communicator was "
          "aborted",
          rank_, size_, what, timeout_.count(), ms);
      request_abort(reason);
      abort();
      throw TimeoutError(reason);
    }
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(1));
  }
}

ncclResult_t NcclCommunicator::async_error() {
  std::lock_guard<std::mutex> guard(abort_mutex_);  // abort() must not free comm_ meanwhile
  if (aborted_.load() || comm_ == nullptr) return ncclSuccess;
  ncclResult_t state = ncclSuccess;
  const ncclResult_t result = ncclCommGetAsyncError(comm_, &state);
  return result != ncclSuccess ? result : state;
}

void NcclCommunicator::request_abort(const std::string& reason) {
  std::lock_guard<std::mutex> guard(reason_mutex_);
  if (abort_requested_.load()) return;
  reason_ = reason;
  abort_requested_.store(true);
}

std::string NcclCommunicator::abort_reason() const {
  std::lock_guard<std::mutex> guard(reason_mutex_);
  return reason_;
}

void NcclCommunicator::abort() {
  std::lock_guard<std::mutex> guard(abort_mutex_);
  if (aborted_.exchange(true)) return;
  if (comm_ != nullptr) ncclCommAbort(comm_);
}

void NcclCommunicator::throw_if_aborting() const {
  if (abort_requested_.load()) throw CollectiveError(abort_reason());
}

}  // namespace ddp::nccl_detail
