#include "ddp/store/store.hpp"

#include <fmt/format.h>

#include "ddp/util/error.hpp"

namespace ddp {

std::vector<std::string> Store::multi_get(const std::vector<std::string>& keys) {
  std::vector<std::string> values;
  values.reserve(keys.size());
  for (const auto& key : keys) values.push_back(get(key));
  return values;
}

void Store::multi_set(const std::vector<std::string>& keys,
                      const std::vector<std::string>& values) {
  if (keys.size() != values.size()) {
    throw UsageError(fmt::format("multi_set: {} keys but {} values; pass one value per key",
                                 keys.size(), values.size()));
  }
  for (size_t i = 0; i < keys.size(); ++i) set(keys[i], values[i]);
}

}  // namespace ddp
