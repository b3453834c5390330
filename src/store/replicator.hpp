#pragma once
// Replicator: a primary TcpStoreServer's stream of writes to its standby (private to src/store).
//
// The loop thread pushes writes (a snapshot of the whole data first); a thread of its own sends
// them in order over one replication connection (TcpStore with kReplicaRole), one at a time, and
// counts the ones the standby acknowledged. The loop applies a write only once it is
// acknowledged, so whatever a client of the primary could have read is on the standby too.
// Any failure (the standby unreachable, too slow, or promoted: it refuses the stream) ends the
// stream for good; failed() says why, and the loop goes on without it. `wake` is called (from
// the replicator's thread) after each acknowledgement and on failure.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "ddp/store/protocol.hpp"

namespace ddp {

class Replicator {
 public:
  struct Write {
    std::string client_id;  // "" for none (the snapshot, a client without an id)
    uint32_t request_id = 0;
    store_protocol::Op op = store_protocol::Op::kSet;
    std::vector<std::string> fields;
  };

  // Connects from the thread (within `request_timeout`), so the constructor does not block.
  Replicator(std::string host, uint16_t port, std::string token,
             std::chrono::milliseconds request_timeout, std::function<void()> wake);
  ~Replicator();
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  // Queues a write; its sequence number (1, 2, ...) is returned.
  uint64_t push(Write write);
  // Writes 1..acknowledged() are on the standby.
  uint64_t acknowledged() const;
  // Why the stream ended, once it did.
  std::optional<std::string> failed() const;
  const std::string& endpoint() const { return endpoint_; }

 private:
  void run();

  const std::string host_;
  const uint16_t port_;
  const std::string endpoint_;
  const std::string token_;
  const std::chrono::milliseconds request_timeout_;
  const std::function<void()> wake_;

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Write> queue_;
  uint64_t pushed_ = 0;
  uint64_t acknowledged_ = 0;
  std::optional<std::string> failed_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace ddp
