#pragma once
// NcclWatchdog: a thread that notices failed and hung collectives of one group.
//
// Every interval it asks NCCL for an asynchronous error and queries the completion event of
// each pending collective, oldest first. On an NCCL error, or when a collective is still
// incomplete after its timeout, it fails that collective with a CollectiveError naming rank,
// collective, sequence number and elapsed time, fails every other pending collective with
// the same cause, and calls `abort(reason)` (which aborts the communicator). Later
// collectives are refused by the group.

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "nccl_communicator.hpp"
#include "nccl_work.hpp"

namespace ddp::nccl_detail {

class NcclWatchdog {
 public:
  using AbortFn = std::function<void(const std::string& reason)>;
  using RoundFn = std::function<void()>;

  // `on_round` (optional) runs on the watchdog thread after every round (the group checks for
  // the launcher's flight recorder dump requests there).
  NcclWatchdog(NcclCommunicator& communicator, int device, int rank, int size,
               std::chrono::milliseconds interval, AbortFn abort, RoundFn on_round = nullptr);
  // Stops and joins the thread.
  ~NcclWatchdog();
  NcclWatchdog(const NcclWatchdog&) = delete;
  NcclWatchdog& operator=(const NcclWatchdog&) = delete;

  void watch(CollectiveStatePtr state);

  // Fails every pending collective with `reason` (the group was aborted).
  void fail_all(const std::string& reason);
  // The same with the error itself (notify_peer_lost's PeerLostError).
  void fail_all(std::exception_ptr error);

 private:
  void run();
  // One round; returns the failure reason, or "" when all is well.
  std::string check();

  NcclCommunicator& communicator_;
  const int device_;
  const int rank_;
  const int size_;
  const std::chrono::milliseconds interval_;
  const AbortFn abort_;
  const RoundFn on_round_;

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::deque<CollectiveStatePtr> pending_;
  std::thread thread_;
};

}  // namespace ddp::nccl_detail
