#include "ddp/store/recovery_notice.hpp"

#include <string>

#include "ddp/util/error.hpp"

namespace ddp::recovery_notice {

namespace {

std::string generation_key() {
  return std::string(kRecoveryPrefix) + "generation";
}

std::string lost_key(int64_t generation) {
  return std::string(kRecoveryPrefix) + "lost/" + std::to_string(generation);
}

}  // namespace

int64_t read_generation(Store& store) {
  return store.add(generation_key(), 0);
}

std::optional<int> read_lost_rank(Store& store, int64_t generation) {
  const std::string key = lost_key(generation);
  if (generation <= 0 || !store.check({key})) return std::nullopt;
  const std::string value = store.get(key);
  try {
    return std::stoi(value);
  } catch (const std::exception&) {
    throw ProtocolError("store key " + key + " holds '" + value +
                        "', not a rank number; only ddprun --recovery step may write under " +
                        kRecoveryPrefix);
  }
}

int64_t publish_lost_rank(Store& store, int64_t current, int rank) {
  store.set(lost_key(current + 1), std::to_string(rank));
  return store.add(generation_key(), 1);
}

}  // namespace ddp::recovery_notice
