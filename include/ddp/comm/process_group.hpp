#pragma once
// ProcessGroup: collectives over a fixed set of ranks (torch.distributed's ProcessGroup).
//
// Contract shared by every backend:
// - Every rank of the group calls the same collectives in the same order with matching
//   dtype and counts. With DDP_DEBUG_COLLECTIVES=1 a mismatch raises CollectiveError naming
//   both calls and the ranks instead of hanging.
// - Operations are asynchronous: they return a Work; buffers must stay alive and untouched
//   until wait() returns. Collectives issued by one thread complete in issue order.
//   send/recv progress independently of collectives (a recv may be posted before the
//   matching send, as in a ring); messages between two ranks with one tag stay in order.
// - Destroying a group waits for its queued operations (each bounded by timeout()).
// - Buffers are raw (pointer, count, dtype). `count` is in elements. Zero counts are allowed.
// - An optional operation a backend lacks throws NotSupportedError("backend X does not
//   support Y").

#include <chrono>
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "ddp/comm/flight_recorder.hpp"
#include "ddp/comm/types.hpp"
#include "ddp/comm/work.hpp"
#include "ddp/util/error.hpp"

namespace ddp {

class ProcessGroup {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{std::chrono::minutes(30)};

  virtual ~ProcessGroup() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }
  virtual std::string backend_name() const = 0;

  // In place: data (count elements) becomes op over all ranks' data. kAvg divides the sum by
  // size() (integer types: truncating division).
  virtual WorkPtr all_reduce(void* data, size_t count, DataType dtype, ReduceOp op) = 0;

  // In place: every rank's data becomes root's data.
  virtual WorkPtr broadcast(void* data, size_t count, DataType dtype, int root) = 0;

  // In place on root: root's data becomes op over all ranks; other ranks' data is unspecified
  // afterwards.
  virtual WorkPtr reduce(void* data, size_t count, DataType dtype, ReduceOp op, int root) = 0;

  // out holds size() * count elements: rank r's input lands at out + r * count.
  virtual WorkPtr all_gather(const void* in, void* out, size_t count, DataType dtype) = 0;

  // Unequal sizes: counts[r] elements from rank r, packed in rank order into out.
  virtual WorkPtr all_gather_v(const void* in, void* out, const std::vector<size_t>& counts,
                               DataType dtype) = 0;

  // As all_gather, but only root receives; out is ignored on other ranks.
  virtual WorkPtr gather(const void* in, void* out, size_t count, DataType dtype, int root) = 0;

  // Root's in holds size() * count elements; rank r receives in + r * count into out.
  virtual WorkPtr scatter(const void* in, void* out, size_t count, DataType dtype, int root) = 0;

  // in holds size() * count elements; rank r receives op over all ranks of block r.
  virtual WorkPtr reduce_scatter(const void* in, void* out, size_t count, DataType dtype,
                                 ReduceOp op) = 0;

  // in and out hold size() * count elements; block j of rank i's in lands in block i of rank
  // j's out.
  virtual WorkPtr all_to_all(const void* in, void* out, size_t count, DataType dtype) = 0;

  virtual WorkPtr barrier() = 0;

  // Point to point. A recv matches the send from `src` with the same tag, in order.
  virtual WorkPtr send(const void* data, size_t count, DataType dtype, int dst, int tag) = 0;
  virtual WorkPtr recv(void* data, size_t count, DataType dtype, int src, int tag) = 0;
  // Receives the next message sent to this rank with `tag` by any rank (PyTorch's recv
  // without src); `*source` holds the sender's rank once the Work completed. Backends cpu
  // and gloo; others throw NotSupportedError.
  virtual WorkPtr recv_any_source(void* /*data*/, size_t /*count*/, DataType /*dtype*/, int /*tag*/,
                                  std::shared_ptr<int> /*source*/) {
    throw NotSupportedError("backend " + backend_name() +
                            " does not support recv from any source; pass the source rank");
  }

  std::chrono::milliseconds timeout() const { return timeout_; }

  // In-place recovery (docs/recovery.md): a member is gone. The operation in flight and every
  // later one fail with `cause` (a PeerLostError, not a TimeoutError) within a bound of about
  // 100 ms instead of the group timeout; the group stays unusable and is replaced by a new
  // generation (RecoverableGroup). Callable from any thread, idempotent (the first cause wins).
  // Backends without it throw NotSupportedError. nccl maps it onto ncclCommAbort of its
  // non-blocking communicator and rethrows `cause` from the aborted works and every later call;
  // a new communicator per generation comes from the unique-id exchange under the new
  // generation's store prefix (RecoverableGroup).
  virtual void notify_peer_lost(const PeerLostError& /*cause*/) {
    throw NotSupportedError("backend " + backend_name() + " does not support notify_peer_lost");
  }

  // This group's flight recorder (its last collectives, dumped on a timeout or failure), or
  // nullptr when the backend has none or DDP_FLIGHT_RECORDER_ENTRIES=0.
  virtual FlightRecorder* flight_recorder() { return nullptr; }

  // Caller tag recorded with every collective this group issues from now on, so a dump says
  // what the caller was doing (DDP: "bucket=3 iter=120"). At most FlightRecorder::kTagBytes-1
  // bytes are kept; "" clears it. A no-op without a recorder.
  void set_call_tag(std::string_view tag) {
    if (FlightRecorder* r = flight_recorder()) r->set_tag(tag);
  }

 protected:
  ProcessGroup(int rank, int size, std::chrono::milliseconds timeout)
      : rank_(rank), size_(size), timeout_(timeout) {}

  int rank_;
  int size_;
  std::chrono::milliseconds timeout_;
};

using ProcessGroupPtr = std::shared_ptr<ProcessGroup>;

}  // namespace ddp
