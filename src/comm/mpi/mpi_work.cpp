#include "mpi_work.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <thread>

#include "ddp/util/deadline.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/logging.hpp"
#include "mpi_runtime.hpp"

namespace ddp::mpi_detail {
namespace {

using Clock = std::chrono::steady_clock;

long long ms_since(Clock::time_point start) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count();
}

std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& ex) {
    return ex.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

void RecorderHandle::dump(const std::string& reason) {
  if (!recorder || dumped.exchange(true)) return;
  try {
    const std::string path = recorder->dump_to_file(reason, dir);
    log::get("ddp.comm")
        ->warn("flight recorder: rank {} (backend mpi) wrote {} ({})", recorder->identity().rank,
               path, reason);
  } catch (const std::exception& e) {
    log::get("ddp.comm")
        ->error(
            "flight recorder: rank {} (backend mpi) could not write its "
            "record: {}",
            recorder->identity().rank, e.what());
  }
}

MpiWork::MpiWork(std::unique_ptr<Operation> operation) : operation_(std::move(operation)) {}

MpiWork::~MpiWork() {
  std::lock_guard<std::mutex> guard(mutex_);
  if (done_ || !operation_) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) poll();
  if (!done_) {
    // MPI forbids freeing or cancelling a pending collective request, and the library may
    // still write into the operation's scratch buffers, so both are abandoned on purpose.
    (void)operation_.release();
  }
}

bool MpiWork::poll() {
  if (done_) return true;
  const bool finished = poll_mpi();
  if (finished && operation_->recorder && operation_->recorder->recorder) {
    FlightRecorder& r = *operation_->recorder->recorder;
    if (error_) {
      const std::string what = message_of(error_);
      r.finished(operation_->record_id, false, what);
      operation_->recorder->dump(what);
    } else {
      r.finished(operation_->record_id, true);
    }
  }
  return finished;
}

bool MpiWork::poll_mpi() {
  int flag = 0;
  MPI_Status status;
  int rc;
  {
    auto lock = Runtime::get().lock();
    rc = MPI_Test(&operation_->request, &flag, &status);
  }
  if (rc != MPI_SUCCESS) {
    done_ = true;
    error_ = std::make_exception_ptr(
        CollectiveError(fmt::format("mpi backend: rank {} of {}: {} failed: {}", operation_->rank,
                                    operation_->size, operation_->description, error_string(rc))));
    return true;
  }
  if (!flag) return false;
  done_ = true;
  if (operation_->expected_count >= 0) {
    int received = 0;
    MPI_Get_count(&status, operation_->datatype, &received);
    if (received != operation_->expected_count) {
      error_ = std::make_exception_ptr(CollectiveError(fmt::format(
          "mpi backend: rank {} of {}: {} received {} elements but expected {}: the matching "
          "send carried a different count; make send and recv agree on count and dtype",
          operation_->rank, operation_->size, operation_->description, received,
          operation_->expected_count)));
      return true;
    }
  }
  try {
    if (operation_->finish) operation_->finish();
  } catch (...) {
    error_ = std::current_exception();
  }
  // Release the scratch buffers early; the description stays for messages.
  operation_->scratch = {};
  operation_->finish = nullptr;
  return true;
}

bool MpiWork::is_completed() {
  std::lock_guard<std::mutex> guard(mutex_);
  return poll();
}

void MpiWork::wait(std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  // A huge timeout (milliseconds::max()) must not overflow the deadline.
  const auto deadline = deadline_after(timeout, start);
  // Spinning on MPI_Test gives the lowest latency for short operations; after a while the
  // waiter yields, then sleeps with a doubling period capped at 1 ms, so a long wait costs
  // little CPU (which matters when ranks oversubscribe the cores) and still notices
  // completion within about 1 ms. The mutex is held per poll only, so is_completed() from
  // another thread never waits for a whole wait().
  constexpr int kSpins = 64;
  constexpr int kYields = 2048;
  auto nap = std::chrono::microseconds(2);
  for (int round = 0;; ++round) {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      if (poll()) {
        if (error_) std::rethrow_exception(error_);
        return;
      }
      if (Clock::now() >= deadline) {
        TimeoutError timeout_error(fmt::format(
            "mpi backend: rank {} of {}: {} did not complete within {} ms (issued {} ms ago): "
            "some rank has not called it yet (it crashed, hangs, or issued a different "
            "collective); MPI cannot name the missing rank. Check that every rank issues the "
            "same collectives in the same order, or raise the timeout",
            operation_->rank, operation_->size, operation_->description, timeout.count(),
            ms_since(issued_)));
        // The operation stays pending (a later wait may still complete it): its entry stays
        // "started"; the record is written now, while the job is stuck.
        if (operation_->recorder) operation_->recorder->dump(timeout_error.what());
        throw timeout_error;
      }
    }
    if (round < kSpins) continue;
    if (round < kYields) {
      std::this_thread::yield();
      continue;
    }
    std::this_thread::sleep_for(nap);
    nap = std::min<std::chrono::microseconds>(nap * 2, std::chrono::milliseconds(1));
  }
}

}  // namespace ddp::mpi_detail
