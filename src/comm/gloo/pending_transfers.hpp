#pragma once
// GlooPendingTransfers: the point-to-point transfers one GlooComm has posted and whose Work has
// not been destroyed, so that in-place recovery's notice can end their waits (internal header).
//
// Shutting the connections down (connection_sockets.hpp) fails a wait tied to one connection,
// but not a recv from any source: Gloo keeps that at the context, not on a pair, so no
// connection's end reaches it. Gloo's UnboundBuffer::abortWaitRecv/abortWaitSend do: each ends
// the buffer's current wait, or the next one when none is running, with `false`. end() calls
// them for every transfer posted and not yet destroyed and keeps the notice's error, which a
// transfer's wait then throws instead of Gloo's own (a connection closed, a wait aborted).
//
// Shared by the communicator and each Work it returned (a Work may outlive its group, so it
// must not reach back into the communicator or the group's AbortSignal).

#include <exception>
#include <mutex>
#include <vector>

namespace gloo::transport {
class UnboundBuffer;
}

namespace ddp::detail {

class GlooPendingTransfers {
 public:
  // A posted transfer's buffer, until forget(). A transfer added after end() is ended at once.
  void add(gloo::transport::UnboundBuffer* buffer, bool is_send);
  void forget(gloo::transport::UnboundBuffer* buffer) noexcept;

  // The notice: records `error` (the first one wins) and ends every transfer's wait. Never
  // throws; thread-safe against add, forget and a wait in flight.
  void end(std::exception_ptr error) noexcept;

  // The error end() recorded; null before end(). A transfer whose wait failed or was aborted
  // throws it when it is set: the failure was the notice's doing. (Gloo checks the abort before
  // the completion: a transfer first waited for after end() throws it even if it completed.)
  std::exception_ptr ended_by() const;

 private:
  struct Pending {
    gloo::transport::UnboundBuffer* buffer;
    bool is_send;
  };
  static void abort_wait(const Pending& pending) noexcept;

  mutable std::mutex mutex_;
  std::vector<Pending> pending_;
  bool ended_ = false;
  std::exception_ptr error_;
};

}  // namespace ddp::detail
