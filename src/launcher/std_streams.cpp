#include "ddp/launcher/std_streams.hpp"

#include <fmt/format.h>

#include <cctype>

#include "ddp/util/error.hpp"

namespace ddp::launcher {

Std StdSpec::for_local_rank(int local_rank) const {
  if (per_rank.empty()) return all;
  auto it = per_rank.find(local_rank);
  return it == per_rank.end() ? Std::kNone : it->second;
}

namespace {

[[noreturn]] void bad_spec(const std::string& text, const std::string& flag) {
  throw UsageError(fmt::format(
      "{}: '{}' is not a stream selector; use 0 (none), 1 (stdout), 2 (stderr), 3 (both) for "
      "every local rank, or a per-rank map like 0:1,1:2",
      flag, text));
}

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 6) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

Std to_std(const std::string& digit, const std::string& text, const std::string& flag) {
  if (digit.size() != 1 || digit[0] < '0' || digit[0] > '3') bad_spec(text, flag);
  return static_cast<Std>(digit[0] - '0');
}

}  // namespace

StdSpec parse_std_spec(const std::string& text, const std::string& flag) {
  StdSpec spec;
  if (text.find(':') == std::string::npos) {
    spec.all = to_std(text, text, flag);
    return spec;
  }
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item =
        text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    size_t colon = item.find(':');
    if (colon == std::string::npos) bad_spec(text, flag);
    std::string rank = item.substr(0, colon);
    if (!all_digits(rank)) bad_spec(text, flag);
    spec.per_rank[std::stoi(rank)] = to_std(item.substr(colon + 1), text, flag);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return spec;
}

}  // namespace ddp::launcher
