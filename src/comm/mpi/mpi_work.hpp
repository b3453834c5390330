#pragma once
// MpiWork: the Work of one non-blocking MPI operation. wait() drives MPI progress by polling
// MPI_Test with a bounded backoff (spin, then yield, then sleeps of at most 1 ms) until the
// request completes or the timeout passes.

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/comm/work.hpp"

namespace ddp::mpi_detail {

// The group's flight recorder, shared with its operations (a Work may outlive its group).
// MPI groups have no store, so only a rank whose own wait times out or fails writes its
// record (once per group); ranks outside the collective do not.
struct RecorderHandle {
  std::unique_ptr<FlightRecorder> recorder;  // null: DDP_FLIGHT_RECORDER_ENTRIES=0
  std::string dir;                           // DDP_FLIGHT_RECORDER_DIR
  std::atomic<bool> dumped{false};
  // Writes the record once; logs the path (or why it could not).
  void dump(const std::string& reason);
};

// Everything an operation needs until MPI_Test reports it complete. MPI reads and writes the
// buffers held here asynchronously, so they must not move or die before completion.
struct Operation {
  std::string description;  // "all_reduce(sum, float32 x 1024) #17"
  int rank = 0;
  int size = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  std::vector<unsigned char> scratch;  // a copy of an input that overlaps the output
  std::vector<int> counts;             // argument arrays of the v-collectives
  std::vector<int> displacements;
  std::function<void()> finish;  // runs once after successful completion (e.g. avg's division)
  // For receives: the element count the message must carry (MPI accepts shorter messages
  // silently; the backend reports them). Negative: no check.
  long long expected_count = -1;
  MPI_Datatype datatype = MPI_DATATYPE_NULL;
  // Flight recorder: set for collectives (not send/recv) when the group records.
  std::optional<CollectiveRecordInfo> record_info;
  std::shared_ptr<RecorderHandle> recorder;
  uint64_t record_id = 0;
};

class MpiWork final : public Work {
 public:
  // `operation->request` has been started.
  explicit MpiWork(std::unique_ptr<Operation> operation);
  ~MpiWork() override;

  // Throws TimeoutError naming the operation, the rank and the limit; CollectiveError when
  // MPI reported an error. After a timeout the operation is still pending and wait() may be
  // called again.
  void wait(std::chrono::milliseconds timeout) override;
  bool is_completed() override;

 private:
  // One MPI_Test; with mutex_ held. Returns whether the operation has finished.
  bool poll();
  bool poll_mpi();  // poll() without the flight recorder bookkeeping

  std::mutex mutex_;
  std::unique_ptr<Operation> operation_;
  bool done_ = false;
  std::exception_ptr error_;
  const std::chrono::steady_clock::time_point issued_ = std::chrono::steady_clock::now();
};

}  // namespace ddp::mpi_detail
