#include "heartbeats.hpp"

#include "keys.hpp"

namespace ddp::rdzv {

std::vector<std::optional<std::string>> read_heartbeats(Store& store,
                                                        const std::vector<std::string>& keys) {
  if (auto* kept = dynamic_cast<KeptAliveKeys*>(&store)) return kept->read_now(keys);
  std::vector<std::optional<std::string>> values(keys.size());
  if (keys.empty() || !store.check(keys)) return values;
  std::vector<std::string> got = store.multi_get(keys);
  for (size_t i = 0; i < keys.size(); ++i) values[i] = std::move(got[i]);
  return values;
}

HeartbeatTracker::HeartbeatTracker(Store& store, std::vector<std::string> keys,
                                   std::chrono::steady_clock::duration stale)
    : store_(store),
      kept_alive_(dynamic_cast<KeptAliveKeys*>(&store) != nullptr),
      keys_(std::move(keys)),
      stale_(stale),
      last_(keys_.size()),
      changed_at_(keys_.size(), std::chrono::steady_clock::now()) {}

std::vector<bool> HeartbeatTracker::poll() {
  std::vector<std::optional<std::string>> values = read_heartbeats(store_, keys_);
  const auto now = std::chrono::steady_clock::now();
  std::vector<bool> gone(keys_.size());
  for (size_t i = 0; i < keys_.size(); ++i) {
    const std::optional<std::string>& v = values[i];
    // A key kept alive stays the same while its member lives: that is not standing still.
    if (v != last_[i] || (v && *v == keys::kAlive)) changed_at_[i] = now;
    last_[i] = v;
    if (!v) {
      gone[i] = kept_alive_ || now - changed_at_[i] > stale_;
    } else {
      gone[i] = *v == keys::kDone || *v == keys::kLeft || *v == keys::kLost ||
                now - changed_at_[i] > stale_;
    }
  }
  return gone;
}

}  // namespace ddp::rdzv
