#include "ddp/store/recovery_notice.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <set>
#include <string>

#include "ddp/util/error.hpp"

namespace ddp::recovery_notice {

namespace {

// The record of a lost node's ranks: "node:<slot>,<slot>,...", of a joined node's ones:
// "join:<slot>,<slot>,..."; under --recovery shrink a lost rank's "left:<slot>" and its
// replacement's "back:<slot>".
constexpr std::string_view kNodePrefix = "node:";
constexpr std::string_view kJoinPrefix = "join:";
constexpr std::string_view kLeftPrefix = "left:";
constexpr std::string_view kBackPrefix = "back:";

std::string generation_key() {
  return std::string(kRecoveryPrefix) + "generation";
}

std::string lost_key(int64_t generation) {
  return std::string(kRecoveryPrefix) + "lost/" + std::to_string(generation);
}

std::string finished_key(int slot) {
  return std::string(kRecoveryPrefix) + "finished/" + std::to_string(slot);
}

std::string finish_count_key() {
  return std::string(kRecoveryPrefix) + "finish_count";
}

struct Record {
  using Kind = RecordKind;
  std::vector<int> slots;  // the ranks' slots, at least one
  Kind kind = Kind::kRestart;
  // The slots leave the membership (a lost node's, a lost rank's under --recovery shrink) or
  // come in (a joined node's, a replacement that is back).
  bool removes() const { return kind == Kind::kNodeLost || kind == Kind::kRankLeft; }
  bool adds() const { return kind == Kind::kNodeJoined || kind == Kind::kRankBack; }
};

int parse_slot(const std::string& key, const std::string& value, const std::string& text) {
  size_t used = 0;
  int slot = -1;
  try {
    slot = std::stoi(text, &used);
  } catch (const std::exception&) {
  }
  if (slot < 0 || used != text.size()) {
    throw ProtocolError(
        "store key " + key + " holds '" + value +
        "', not a rank, 'node:<ranks>', 'join:<ranks>', 'left:<rank>' or 'back:<rank>'; only "
        "ddprun --recovery step may "
        "write under " +
        kRecoveryPrefix);
  }
  return slot;
}

std::optional<Record> read_record(Store& store, int64_t generation) {
  const std::string key = lost_key(generation);
  if (generation <= 0 || !store.check({key})) return std::nullopt;
  const std::string value = store.get(key);
  Record record;
  std::string list = value;
  for (const auto& [prefix, kind] : {std::pair{kNodePrefix, Record::Kind::kNodeLost},
                                     {kJoinPrefix, Record::Kind::kNodeJoined},
                                     {kLeftPrefix, Record::Kind::kRankLeft},
                                     {kBackPrefix, Record::Kind::kRankBack}}) {
    if (value.compare(0, prefix.size(), prefix) == 0) {
      record.kind = kind;
      list = value.substr(prefix.size());
      break;
    }
  }
  size_t at = 0;
  for (;;) {
    const size_t comma = list.find(',', at);
    record.slots.push_back(parse_slot(key, value, list.substr(at, comma - at)));
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return record;
}

// Claims the lowest free lost/<g> above the counter with `value`, then raises the counter.
// Claims are dense, and a claim sets its key before its writer raises the counter.
int64_t claim_generation(Store& store, const std::string& value) {
  for (int64_t g = read_generation(store) + 1;; ++g) {
    if (store.compare_set(lost_key(g), "", value) == value) {
      store.add(generation_key(), 1);
      return g;
    }
  }
}

}  // namespace

int64_t read_generation(Store& store) {
  return store.add(generation_key(), 0);
}

WaitOutcome wait_for_record(Store& store, int64_t generation, std::chrono::milliseconds timeout,
                            WaitInterrupter* interrupter) {
  const std::vector<std::string> keys{lost_key(generation)};
  if (auto* interruptible = dynamic_cast<InterruptibleWait*>(&store);
      interruptible != nullptr && interrupter != nullptr) {
    return interruptible->wait_interruptibly(keys, timeout, *interrupter);
  }
  try {
    store.wait(keys, timeout);
    return WaitOutcome::kSet;
  } catch (const TimeoutError&) {
    return WaitOutcome::kTimedOut;
  }
}

std::optional<int> read_lost_rank(Store& store, int64_t generation) {
  const std::optional<Record> record = read_record(store, generation);
  if (!record) return std::nullopt;
  return record->slots.front();
}

std::optional<RecordKind> read_record_kind(Store& store, int64_t generation) {
  const std::optional<Record> record = read_record(store, generation);
  if (!record) return std::nullopt;
  return record->kind;
}

std::vector<int> read_removed_slots(Store& store, int64_t generation) {
  const std::optional<Record> record = read_record(store, generation);
  if (!record || !record->removes()) return {};
  return record->slots;
}

std::vector<int> read_joined_slots(Store& store, int64_t generation) {
  const std::optional<Record> record = read_record(store, generation);
  if (!record || !record->adds()) return {};
  return record->slots;
}

std::vector<int> members(Store& store, int64_t generation, int initial_world_size) {
  std::vector<bool> removed(static_cast<size_t>(std::max(initial_world_size, 0)), false);
  std::set<int> grown;  // slots past the launch's that a joining node added
  for (int64_t g = 1; g <= generation; ++g) {
    const std::optional<Record> record = read_record(store, g);
    if (!record || record->kind == Record::Kind::kRestart) continue;
    const bool lost = record->removes();
    for (int slot : record->slots) {
      if (slot < initial_world_size) {
        removed[static_cast<size_t>(slot)] = lost;
      } else if (lost) {
        grown.erase(slot);
      } else {
        grown.insert(slot);
      }
    }
  }
  std::vector<int> out;
  for (int slot = 0; slot < initial_world_size; ++slot) {
    if (!removed[static_cast<size_t>(slot)]) out.push_back(slot);
  }
  out.insert(out.end(), grown.begin(), grown.end());
  return out;
}

bool removed_between(Store& store, int slot, int64_t after, int64_t upto) {
  for (int64_t g = std::max<int64_t>(after, 0) + 1; g <= upto; ++g) {
    const std::optional<Record> record = read_record(store, g);
    if (record && record->kind == Record::Kind::kNodeLost &&
        std::find(record->slots.begin(), record->slots.end(), slot) != record->slots.end()) {
      return true;
    }
  }
  return false;
}

bool awaits_return(Store& store, int slot, int64_t generation) {
  std::optional<RecordKind> last;  // of the newest record naming the slot
  for (int64_t g = 1; g <= generation; ++g) {
    const std::optional<Record> record = read_record(store, g);
    if (record &&
        std::find(record->slots.begin(), record->slots.end(), slot) != record->slots.end()) {
      last = record->kind;
    }
  }
  return last == RecordKind::kRankLeft;
}

int64_t publish_lost_rank(Store& store, int rank) {
  return claim_generation(store, std::to_string(rank));
}

int64_t publish_lost_node(Store& store, const std::vector<int>& slots) {
  if (slots.empty()) throw UsageError("recovery_notice::publish_lost_node: no rank given");
  return claim_generation(store, fmt::format("{}{}", kNodePrefix, fmt::join(slots, ",")));
}

int64_t publish_rank_left(Store& store, int rank) {
  return claim_generation(store, fmt::format("{}{}", kLeftPrefix, rank));
}

int64_t publish_rank_back(Store& store, int rank) {
  return claim_generation(store, fmt::format("{}{}", kBackPrefix, rank));
}

int64_t publish_joined_node(Store& store, const std::vector<int>& slots) {
  if (slots.empty()) throw UsageError("recovery_notice::publish_joined_node: no rank given");
  return claim_generation(store, fmt::format("{}{}", kJoinPrefix, fmt::join(slots, ",")));
}

void publish_finished(Store& store, int slot, int64_t generation) {
  // The record before the count: a waiter that sees the count finds the record.
  store.set(finished_key(slot), std::to_string(generation));
  store.add(finish_count_key(), 1);
}

void clear_finished(Store& store, int slot) {
  // Emptied, not deleted: a reader that saw the key set must not wait in get() for it.
  if (store.check({finished_key(slot)})) store.set(finished_key(slot), "");
}

int64_t read_finish_count(Store& store) {
  return store.add(finish_count_key(), 0);
}

void announce_step_manager(Store& store) {
  store.add(std::string(kRecoveryPrefix) + "step_managers", 1);
}

bool step_manager_announced(Store& store) {
  return store.add(std::string(kRecoveryPrefix) + "step_managers", 0) > 0;
}

std::vector<int> finished_slots(Store& store, const std::vector<int>& slots) {
  const int64_t newest = read_generation(store);
  std::vector<int> out;
  for (int slot : slots) {
    const std::string key = finished_key(slot);
    if (!store.check({key})) continue;
    const std::string value = store.get(key);
    if (value.empty()) continue;  // cleared: the slot formed a group again
    size_t used = 0;
    int64_t written = -1;
    try {
      written = std::stoll(value, &used);
    } catch (const std::exception&) {
    }
    if (written < 0 || used != value.size()) {
      throw ProtocolError("store key " + key + " holds '" + value +
                          "', not a membership generation; only ddp's RecoverableGroup may "
                          "write it");
    }
    bool overridden = false;
    for (int64_t g = written + 1; g <= newest && !overridden; ++g) {
      const std::optional<Record> record = read_record(store, g);
      overridden = record && std::find(record->slots.begin(), record->slots.end(), slot) !=
                                 record->slots.end();
    }
    if (!overridden) out.push_back(slot);
  }
  return out;
}

}  // namespace ddp::recovery_notice
