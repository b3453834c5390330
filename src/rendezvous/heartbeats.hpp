#pragma once
// Telling a round's live members from gone ones by their heartbeat keys (rdzv/<run>/<g>/hb/<i>),
// for both kinds of heartbeat a member writes (membership_watcher.cpp):
//   - a counter rewritten every period: the member is gone once it stood still for `stale`;
//   - on a store that keeps keys alive (KeptAliveKeys: etcd), keys::kAlive attached to the
//     member's lease: live while present, gone once the store deleted it (the lease expired).
// "done", "left" and "lost" mark a member gone either way. Until a member's watcher first
// beats, its key holds the "0" it wrote when it joined: a counter that stands still.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "ddp/store/kept_alive_keys.hpp"
#include "ddp/store/store.hpp"

namespace ddp::rdzv {

// The keys' values now (nullopt: absent): one read on a KeptAliveKeys store; on others, whose
// heartbeat keys exist from the join on, a multi_get once check() found them all (else all
// nullopt: a multi_get would wait for the missing ones).
std::vector<std::optional<std::string>> read_heartbeats(Store& store,
                                                        const std::vector<std::string>& keys);

class HeartbeatTracker {
 public:
  HeartbeatTracker(Store& store, std::vector<std::string> keys,
                   std::chrono::steady_clock::duration stale);

  // Reads the keys and returns, for each, whether its member is gone now. An absent key is gone
  // on a KeptAliveKeys store; elsewhere it counts as a value that stands still.
  std::vector<bool> poll();

 private:
  Store& store_;
  const bool kept_alive_;
  std::vector<std::string> keys_;
  std::chrono::steady_clock::duration stale_;
  std::vector<std::optional<std::string>> last_;
  std::vector<std::chrono::steady_clock::time_point> changed_at_;
};

}  // namespace ddp::rdzv
