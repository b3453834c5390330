#include "ddp/cluster/hostlist.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <cstdint>

#include "ddp/util/error.hpp"

namespace ddp::cluster {

namespace {

// Positions in messages are 1-based character offsets into the whole list.
[[noreturn]] void fail(const std::string& list, size_t pos, const std::string& what,
                       const std::string& fix) {
  throw UsageError(
      fmt::format("host list \"{}\": {} at position {}: {}", list, what, pos + 1, fix));
}

bool is_separator(char c) {
  return c == ',' || std::isspace(static_cast<unsigned char>(c));
}

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// 18 digits always fit in uint64_t; longer numbers are no host index anyone uses.
constexpr size_t kMaxDigits = 18;

uint64_t parse_number(const std::string& list, size_t pos, const std::string& digits) {
  if (digits.size() > kMaxDigits) {
    fail(list, pos, fmt::format("number {} is too long", digits),
         fmt::format("use at most {} digits", kMaxDigits));
  }
  return std::stoull(digits);
}

// One bracket group "[...]" whose contents start at list[begin] and end before list[end].
// Returns the formatted numbers in order.
std::vector<std::string> expand_bracket(const std::string& list, size_t begin, size_t end) {
  if (begin == end) {
    fail(list, begin - 1, "empty brackets \"[]\"",
         "put numbers or ranges inside, e.g. \"node[1-4]\"");
  }
  std::vector<std::string> out;
  size_t item_begin = begin;
  while (item_begin <= end) {
    size_t item_end = list.find(',', item_begin);
    if (item_end == std::string::npos || item_end > end) item_end = end;
    std::string item = list.substr(item_begin, item_end - item_begin);
    if (item.empty()) {
      fail(list, item_begin, "empty entry inside brackets",
           "remove the stray comma, e.g. \"node[1,3]\"");
    }
    if (item.find(':') != std::string::npos) {
      fail(list, item_begin + item.find(':'), fmt::format("range with a step \"{}\"", item),
           "SLURM host lists have no steps: list the numbers, e.g. \"node[1,3,5]\"");
    }
    size_t dash = item.find('-');
    std::string lo_text = dash == std::string::npos ? item : item.substr(0, dash);
    std::string hi_text = dash == std::string::npos ? item : item.substr(dash + 1);
    if (!all_digits(lo_text) || !all_digits(hi_text)) {
      fail(list, item_begin, fmt::format("\"{}\" is not a number or a range lo-hi", item),
           "brackets hold non-negative numbers and ranges, e.g. \"node[01-04,07]\"");
    }
    uint64_t lo = parse_number(list, item_begin, lo_text);
    uint64_t hi = parse_number(list, item_begin, hi_text);
    if (lo > hi) {
      fail(list, item_begin, fmt::format("reversed range {}", item),
           fmt::format("write the lower number first: \"{}-{}\"", hi_text, lo_text));
    }
    if (hi - lo >= kMaxHosts || out.size() + (hi - lo + 1) > kMaxHosts) {
      fail(list, item_begin, fmt::format("range {} expands to too many hosts", item),
           fmt::format("a host list may name at most {} hosts", kMaxHosts));
    }
    // SLURM pads every number of a range to the width of its lower bound.
    for (uint64_t n = lo; n <= hi; ++n) {
      out.push_back(fmt::format("{:0{}}", n, lo_text.size()));
    }
    item_begin = item_end + 1;
  }
  return out;
}

// Expands one host entry (no top-level separators) that starts at list[begin].
void expand_entry(const std::string& list, size_t begin, size_t end,
                  std::vector<std::string>& out) {
  // Product of the literal parts and bracket groups, built left to right so the leftmost
  // group varies slowest.
  std::vector<std::string> partial{""};
  size_t pos = begin;
  while (pos < end) {
    size_t open = list.find('[', pos);
    if (open == std::string::npos || open >= end) open = end;
    std::string literal = list.substr(pos, open - pos);
    if (open == end && pos != begin && !literal.empty()) {
      // SLURM (22.05) rejects text after the last group; accepting it would let a list that
      // works here fail in scontrol and sbatch.
      fail(list, pos, fmt::format("text \"{}\" after ']'", literal),
           "SLURM host lists end each name with its last bracket group; list such names "
           "one by one");
    }
    for (auto& p : partial) p += literal;
    if (open == end) break;
    size_t close = list.find(']', open);  // the tokenizer guarantees it exists before end
    std::vector<std::string> numbers = expand_bracket(list, open + 1, close);
    if (partial.size() * numbers.size() + out.size() > kMaxHosts) {
      fail(list, open, "host entry expands to too many hosts",
           fmt::format("a host list may name at most {} hosts", kMaxHosts));
    }
    std::vector<std::string> next;
    next.reserve(partial.size() * numbers.size());
    for (const auto& p : partial) {
      for (const auto& n : numbers) next.push_back(p + n);
    }
    partial = std::move(next);
    pos = close + 1;
  }
  out.insert(out.end(), partial.begin(), partial.end());
}

// Splits a host name into its prefix and trailing digits ("gpu007" -> "gpu", "007").
std::pair<std::string, std::string> split_trailing_number(const std::string& host) {
  size_t cut = host.size();
  while (cut > 0 && std::isdigit(static_cast<unsigned char>(host[cut - 1]))) --cut;
  if (host.size() - cut > kMaxDigits) cut = host.size() - kMaxDigits;
  return {host.substr(0, cut), host.substr(cut)};
}

}  // namespace

std::vector<std::string> expand_hostlist(const std::string& list) {
  std::vector<std::string> hosts;
  size_t entry_begin = std::string::npos;   // start of the entry being read
  size_t open_bracket = std::string::npos;  // position of the '[' we are inside
  bool any_entry = false;
  for (size_t i = 0; i < list.size(); ++i) {
    char c = list[i];
    if (open_bracket != std::string::npos) {
      if (c == '[') fail(list, i, "nested '['", "brackets cannot nest; close the first one");
      if (c == ']') open_bracket = std::string::npos;
      if (std::isspace(static_cast<unsigned char>(c))) {
        fail(list, i, "whitespace inside brackets", "remove it, e.g. \"node[1-4]\"");
      }
      continue;
    }
    if (c == ']') fail(list, i, "']' without a matching '['", "remove it or add the '['");
    if (is_separator(c)) {
      if (entry_begin != std::string::npos) {
        expand_entry(list, entry_begin, i, hosts);
        entry_begin = std::string::npos;
      }
      continue;
    }
    if (c == '[') open_bracket = i;
    if (entry_begin == std::string::npos) {
      entry_begin = i;
      any_entry = true;
    }
  }
  if (open_bracket != std::string::npos) {
    fail(list, open_bracket, "unclosed '['", "add the matching ']'");
  }
  if (!any_entry) {
    throw UsageError(
        fmt::format("host list \"{}\" is empty: name at least one host, e.g. \"node[1-4]\"", list));
  }
  if (entry_begin != std::string::npos) expand_entry(list, entry_begin, list.size(), hosts);
  return hosts;
}

std::string compress_hostlist(const std::vector<std::string>& hosts) {
  std::string out;
  size_t i = 0;
  while (i < hosts.size()) {
    if (!out.empty()) out += ',';
    auto [prefix, digits] = split_trailing_number(hosts[i]);
    if (digits.empty()) {
      out += hosts[i++];
      continue;
    }
    // Ranges over the run of adjacent hosts that share this prefix and end in a number.
    std::vector<std::string> ranges;
    size_t count = 0;
    while (i < hosts.size()) {
      auto [p, d] = split_trailing_number(hosts[i]);
      if (p != prefix || d.empty()) break;
      uint64_t lo = std::stoull(d);
      uint64_t hi = lo;
      size_t width = d.size();
      std::string lo_text = d;
      ++i;
      ++count;
      while (i < hosts.size()) {
        auto [p2, d2] = split_trailing_number(hosts[i]);
        if (p2 != prefix || d2.empty() || hi == UINT64_MAX) break;
        // The next host joins the range only if expansion would print it identically.
        if (d2 != fmt::format("{:0{}}", hi + 1, width)) break;
        ++hi;
        ++i;
        ++count;
      }
      ranges.push_back(hi == lo ? lo_text : fmt::format("{}-{:0{}}", lo_text, hi, width));
    }
    if (count == 1) {
      out += prefix + ranges[0];
    } else {
      out += prefix + "[" + fmt::format("{}", fmt::join(ranges, ",")) + "]";
    }
  }
  return out;
}

}  // namespace ddp::cluster
