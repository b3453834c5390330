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

int64_t publish_lost_rank(Store& store, int rank) {
  const std::string value = std::to_string(rank);
  // Claims are dense (each writer takes the lowest free g above the counter), and a claim sets
  // its key before its writer raises the counter.
  for (int64_t g = read_generation(store) + 1;; ++g) {
    if (store.compare_set(lost_key(g), "", value) == value) {
      store.add(generation_key(), 1);
      return g;
    }
  }
}

}  // namespace ddp::recovery_notice
