#pragma once
// The state of one NCCL collective, shared by its Work and the watchdog, and the Work itself.

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <mutex>
#include <string>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/comm/work.hpp"

namespace ddp::nccl_detail {

// Where Work::wait makes the compute stream wait: the group's current compute stream,
// shared so that set_compute_stream also redirects waits of Works issued earlier.
using StreamCell = std::shared_ptr<std::atomic<cudaStream_t>>;

struct CollectiveState {
  CollectiveState(std::string description, uint64_t sequence, int rank, int size, int device,
                  std::chrono::milliseconds timeout);
  ~CollectiveState();
  CollectiveState(const CollectiveState&) = delete;
  CollectiveState& operator=(const CollectiveState&) = delete;

  // Whether the completion event fired; never blocks. Errors of the query are failures.
  bool query();
  // Records the first failure; later ones are dropped.
  void fail(std::exception_ptr error);
  bool failed();
  void rethrow_if_failed();

  const std::string description;  // "all_reduce(sum, float32 x 1024)"
  const uint64_t sequence;
  const int rank;
  const int size;
  const int device;
  const std::chrono::milliseconds timeout;
  const std::chrono::steady_clock::time_point issued = std::chrono::steady_clock::now();
  cudaEvent_t done = nullptr;  // recorded on the communication stream after the collective
  // The group's flight recorder and this collective's entry (null for send/recv or when off):
  // query() marks it completed when the event first fires, fail() marks it failed.
  std::shared_ptr<FlightRecorder> recorder;
  uint64_t record_id = 0;

 private:
  std::atomic<bool> completed_{false};
  std::mutex mutex_;
  std::exception_ptr error_;
};

using CollectiveStatePtr = std::shared_ptr<CollectiveState>;

class NcclWork final : public Work {
 public:
  NcclWork(CollectiveStatePtr state, StreamCell compute_stream, bool block_host);

  // Non-blocking mode: makes the compute stream wait for the collective and returns; throws
  // the collective's failure if the watchdog already recorded one. Blocking mode: polls the
  // completion event until it fires, the collective fails, or `timeout` passes
  // (TimeoutError).
  void wait(std::chrono::milliseconds timeout) override;
  bool is_completed() override;

 private:
  CollectiveStatePtr state_;
  StreamCell compute_stream_;
  bool block_host_;
};

}  // namespace ddp::nccl_detail
