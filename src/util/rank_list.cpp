#include "ddp/util/rank_list.hpp"

#include <fmt/format.h>

namespace ddp {

std::string format_rank_list(const std::vector<int>& ranks, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!out.empty()) out += separator;
    out += j == i ? fmt::format("{}", ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[j]);
    i = j + 1;
  }
  return out;
}

}  // namespace ddp
