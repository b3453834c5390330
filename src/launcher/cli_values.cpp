#include "cli_values.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cerrno>
#include <cstdlib>

#include "ddp/util/error.hpp"

namespace ddp::launcher::detail {

std::string first_long_name(const std::string& names) {
  size_t start = 0;
  while (start < names.size()) {
    size_t comma = names.find(',', start);
    std::string name =
        names.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (name.rfind("--", 0) == 0) return name;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return names;
}

std::optional<Sourced> value_of(const ValueFlag& f, const EnvLookup& env) {
  if (f.option->count() > 0) return Sourced{f.cli_value, first_long_name(f.names)};
  if (f.env.empty()) return std::nullopt;  // a flag torchrun reads no PET_ variable for
  auto v = env(f.env);
  if (v && !v->empty()) return Sourced{*v, f.env};  // torchrun ignores empty PET_ values
  return std::nullopt;
}

bool bool_of(const BoolFlag& f, const EnvLookup& env) {
  if (f.option->count() > 0) return f.cli_value;
  auto v = env(f.env);
  if (!v) return false;
  // Set but empty: on. PyTorchJob's elastic policy sets PET_STANDALONE="" for standalone: true
  // (torchrun itself fails on it: int("")).
  if (v->empty()) return true;
  // torchrun: bool(int(value)).
  char* end = nullptr;
  long parsed = std::strtol(v->c_str(), &end, 10);
  if (end == v->c_str() || *end != '\0') {
    throw UsageError(fmt::format("{}={}: expected an integer (1 turns {} on, 0 off)", f.env, *v,
                                 first_long_name(f.names)));
  }
  return parsed != 0;
}

int parse_int(const Sourced& s, int min, int max, const std::string& what) {
  const std::string& v = s.value;
  char* end = nullptr;
  errno = 0;
  long parsed = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || end == v.c_str() || *end != '\0' || errno != 0 || parsed < min || parsed > max) {
    throw UsageError(fmt::format("{}: '{}' is not {}", s.source, v, what));
  }
  return static_cast<int>(parsed);
}

double parse_positive_double(const Sourced& s) {
  char* end = nullptr;
  double parsed = std::strtod(s.value.c_str(), &end);
  if (end == s.value.c_str() || *end != '\0' || !(parsed > 0)) {
    throw UsageError(fmt::format("{}: '{}' is not a positive number of seconds (e.g. 5 or 0.5)",
                                 s.source, s.value));
  }
  return parsed;
}

std::vector<int> parse_rank_list(const Sourced& s) {
  std::vector<int> ranks;
  size_t start = 0;
  while (start <= s.value.size()) {
    size_t comma = s.value.find(',', start);
    std::string item =
        s.value.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    ranks.push_back(parse_int({item, s.source}, 0, 1 << 20,
                              "a comma-separated list of local ranks like 0 or 0,1"));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return ranks;
}

std::vector<std::string> split_filters(const std::string& text) {
  std::vector<std::string> out(1);
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != ',') {
      out.back() += text[i];
    } else if (i + 1 < text.size() && text[i + 1] == ',') {
      out.back() += ',';
      ++i;
    } else {
      out.emplace_back();
    }
  }
  return out;
}

std::optional<std::chrono::milliseconds> env_seconds(const EnvLookup& env, const char* name,
                                                     Seconds range) {
  auto text = env(name);
  if (!text || text->empty()) return std::nullopt;
  char* end = nullptr;
  const double seconds = std::strtod(text->c_str(), &end);
  const bool positive = range == Seconds::kPositive;
  if (end == text->c_str() || *end != '\0' || !(positive ? seconds > 0 : seconds >= 0)) {
    throw UsageError(fmt::format("{}={}: expected seconds ({}, e.g. 30 or 0.5)", name, *text,
                                 positive ? "more than 0" : "0 or more"));
  }
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
}

rdzv::NodeRange parse_nnodes(const Sourced& s) {
  try {
    return rdzv::parse_nnodes(s.value);
  } catch (const UsageError& e) {
    // Name the source actually used (PET_NNODES or --nnodes).
    std::string m = e.what();
    if (s.source != "--nnodes" && m.rfind("--nnodes", 0) == 0) m = s.source + m.substr(8);
    throw UsageError(m);
  }
}

}  // namespace ddp::launcher::detail
