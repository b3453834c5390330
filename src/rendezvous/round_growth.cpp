#include "round_growth.hpp"

#include <algorithm>
#include <string>

namespace ddp::rdzv {

int read_extent(Store& store, const keys::Round& k, int formed) {
  if (!store.check({k.extent()})) return formed;
  return std::max(formed, static_cast<int>(keys::int_value(store.get(k.extent()), k.extent())));
}

void raise_extent(Store& store, const keys::Round& k, int to) {
  std::string current = store.compare_set(k.extent(), "", std::to_string(to));
  while (keys::int_value(current, k.extent()) < to) {
    current = store.compare_set(k.extent(), current, std::to_string(to));
  }
}

bool is_grown_member(Store& store, const keys::Round& k, int slot) {
  return store.check({k.rank(slot)});
}

std::vector<int> round_members(Store& store, const keys::Round& k, int formed) {
  std::vector<int> out;
  for (int i = 0; i < formed; ++i) out.push_back(i);
  const int extent = read_extent(store, k, formed);
  for (int i = formed; i < extent; ++i) {
    if (is_grown_member(store, k, i)) out.push_back(i);
  }
  return out;
}

int64_t live_nodes(Store& store, const keys::Round& k, int formed, std::optional<int64_t> lost) {
  if (!lost) lost = store.add(k.lost(), 0);
  return formed + store.add(k.grown(), 0) - store.add(k.withdrawn(), 0) - *lost +
         store.add(k.back(), 0);
}

}  // namespace ddp::rdzv
