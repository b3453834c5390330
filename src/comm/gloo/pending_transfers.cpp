#include "pending_transfers.hpp"

#include <gloo/transport/unbound_buffer.h>

#include <algorithm>

namespace ddp::detail {

void GlooPendingTransfers::add(gloo::transport::UnboundBuffer* buffer, bool is_send) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.push_back({buffer, is_send});
  if (ended_) abort_wait(pending_.back());
}

void GlooPendingTransfers::forget(gloo::transport::UnboundBuffer* buffer) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [&](const Pending& p) { return p.buffer == buffer; }),
                 pending_.end());
}

void GlooPendingTransfers::end(std::exception_ptr error) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ended_) return;
  ended_ = true;
  error_ = std::move(error);
  // Under the lock: forget() (the Work's destructor) waits for it, so no buffer is destroyed
  // while it is being aborted. abortWait* only takes the buffer's own lock, which a wait in
  // flight releases while it sleeps.
  for (const Pending& p : pending_) abort_wait(p);
}

std::exception_ptr GlooPendingTransfers::ended_by() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return error_;
}

void GlooPendingTransfers::abort_wait(const Pending& pending) noexcept {
  if (pending.is_send) {
    pending.buffer->abortWaitSend();
  } else {
    pending.buffer->abortWaitRecv();
  }
}

}  // namespace ddp::detail
