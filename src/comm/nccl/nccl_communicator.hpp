#pragma once
// NcclCommunicator: one ncclComm_t in NCCL's non-blocking mode, so that no NCCL call can block
// forever: init, group launches and finalisation return ncclInProgress and this class polls
// ncclCommGetAsyncError until they finish, fail, or run past the timeout.
//
// Thread safety: async_error() and request_abort() may be called from any thread (the
// watchdog). Everything else is called with the process group's launch lock held, which is
// also what abort() needs, so the communicator is never freed under a running call.

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <string>

namespace ddp::nccl_detail {

class NcclCommunicator {
 public:
  // Joins the `size`-rank communicator identified by `id` on the current CUDA device. Throws
  // TimeoutError when not every rank joined within `timeout`, CollectiveError on NCCL errors.
  // `interrupt` (NcclOptions::interrupt), when set, is called while the init is under way:
  // what it throws aborts the communicator and reaches the caller.
  NcclCommunicator(const ncclUniqueId& id, int rank, int size, std::chrono::milliseconds timeout,
                   const std::function<void()>& interrupt = {});
  // Flushes and destroys the communicator, bounded by the timeout (aborts past it).
  ~NcclCommunicator();
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  ncclComm_t get() const { return comm_; }

  // Accepts ncclSuccess, waits out ncclInProgress (see wait_ready), throws on anything else.
  void check(ncclResult_t result, const std::string& what);

  // Polls until the pending non-blocking operation finished. Throws CollectiveError when NCCL
  // fails or an abort was requested, TimeoutError (after aborting) past the timeout.
  void wait_ready(const std::string& what, const std::function<void()>& interrupt = {});

  // NCCL's asynchronous error state: ncclSuccess or ncclInProgress while healthy. After
  // abort() it returns ncclSuccess without touching the freed communicator.
  ncclResult_t async_error();

  // Marks the communicator as failing with `reason` (the first reason wins); launches and
  // waits in progress notice it and throw. Any thread.
  void request_abort(const std::string& reason);
  bool abort_requested() const { return abort_requested_.load(); }
  std::string abort_reason() const;

  // ncclCommAbort, once. Call with the launch lock held, after request_abort.
  void abort();
  bool aborted() const { return aborted_.load(); }

  // Throws CollectiveError(abort_reason) once an abort was requested.
  void throw_if_aborting() const;

 private:
  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
  ncclComm_t comm_ = nullptr;
  std::atomic<bool> abort_requested_{false};
  std::atomic<bool> aborted_{false};
  std::mutex abort_mutex_;  // orders async_error's NCCL call against ncclCommAbort
  mutable std::mutex reason_mutex_;
  std::string reason_;
};

}  // namespace ddp::nccl_detail
