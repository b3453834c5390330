#include "nccl_work.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "cuda_util.hpp"
#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"

namespace ddp::nccl_detail {
namespace {

using Clock = std::chrono::steady_clock;

long long ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

}  // namespace

CollectiveState::CollectiveState(std::string description_, uint64_t sequence_, int rank_, int size_,
                                 int device_, std::chrono::milliseconds timeout_)
    : description(std::move(description_)),
      sequence(sequence_),
      rank(rank_),
      size(size_),
      device(device_),
      timeout(timeout_) {
  check_cuda(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate", rank);
}

CollectiveState::~CollectiveState() {
  // Safe while the event is pending: CUDA releases it once it completes.
  if (done != nullptr) cudaEventDestroy(done);
}

bool CollectiveState::query() {
  if (completed_.load()) return true;
  const cudaError_t result = cudaEventQuery(done);
  if (result == cudaSuccess) {
    if (!completed_.exchange(true) && recorder && !failed()) recorder->finished(record_id, true);
    return true;
  }
  if (result == cudaErrorNotReady) return false;
  cudaGetLastError();  // clear a non-sticky error so unrelated later calls do not report it
  fail(std::make_exception_ptr(CollectiveError(fmt::format(
      "nccl backend: rank {} of {}: {} (sequence {}) failed on device {}: {} ({})", rank, size,
      description, sequence, device, cudaGetErrorString(result), cudaGetErrorName(result)))));
  return true;
}

void CollectiveState::fail(std::exception_ptr error) {
  std::lock_guard<std::mutex> guard(mutex_);
  if (error_) return;
  error_ = std::move(error);
  if (!recorder) return;
  try {
    std::rethrow_exception(error_);
  } catch (const std::exception& e) {
    recorder->finished(record_id, false, e.what());
  } catch (...) {
    recorder->finished(record_id, false, "unknown error");
  }
}

bool CollectiveState::failed() {
  std::lock_guard<std::mutex> guard(mutex_);
  return static_cast<bool>(error_);
}

void CollectiveState::rethrow_if_failed() {
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> guard(mutex_);
    error = error_;
  }
  if (error) std::rethrow_exception(error);
}

NcclWork::NcclWork(CollectiveStatePtr state, StreamCell compute_stream, bool block_host)
    : state_(std::move(state)),
      compute_stream_(std::move(compute_stream)),
      block_host_(block_host) {}

bool NcclWork::is_completed() {
  return state_->failed() || state_->query();
}

void NcclWork::wait(std::chrono::milliseconds timeout) {
  if (!block_host_) {
    // Also for a failed collective: its kernel may still run after an abort (a non-blocking
    // communicator's abort returns before its kernels ended), and the caller frees the buffers
    // it passed once wait() returned or threw; the compute stream, on which the caching
    // allocator reuses that memory, must not run ahead of the kernel. The collective's own
    // error is thrown first, before any error of this call.
    cudaError_t ordered = cudaSuccess;
    {
      DeviceGuard guard(state_->device, state_->rank);
      ordered = cudaStreamWaitEvent(compute_stream_->load(), state_->done, 0);
    }
    state_->rethrow_if_failed();
    check_cuda(ordered, "cudaStreamWaitEvent (compute stream on a collective)", state_->rank);
    return;
  }
  state_->rethrow_if_failed();
  const auto start = Clock::now();
  // Saturating: min<Clock::duration>(max(), ...) converted max() to nanoseconds first, which
  // overflows to a deadline in the past.
  const auto deadline = deadline_after(timeout, start);
  auto nap = std::chrono::microseconds(1);
  while (!state_->query()) {
    state_->rethrow_if_failed();
    if (Clock::now() >= deadline) {
      throw TimeoutError(fmt::format(
          "nccl backend: rank {} of {}: {} (sequence {}) did not complete within {} ms (issued "
          "{} ms ago): a rank has not joined it (crashed, hung, or on a different collective). "
          "The watchdog aborts the communicator after the group's timeout of {} ms",
          state_->rank, state_->size, state_->description, state_->sequence, timeout.count(),
          ms_since(state_->issued), state_->timeout.count()));
    }
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::microseconds(500));
  }
  state_->rethrow_if_failed();
}

}  // namespace ddp::nccl_detail
