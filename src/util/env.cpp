#include "ddp/util/env.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "ddp/util/error.hpp"

namespace ddp::env {

std::optional<std::string> get(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

std::string get_or(const char* name, const std::string& fallback) {
  auto value = get(name);
  return value && !value->empty() ? *value : fallback;
}

std::optional<int64_t> get_int(const char* name) {
  auto value = get(name);
  if (!value || value->empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long long parsed = std::strtoll(value->c_str(), &end, 10);
  if (errno != 0 || end == value->c_str() || *end != '\0') {
    throw UsageError(fmt::format("environment variable {}={} is not an integer", name, *value));
  }
  return static_cast<int64_t>(parsed);
}

bool get_bool(const char* name, bool fallback) {
  auto value = get(name);
  if (!value) return fallback;
  std::string lower = *value;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (lower == "1" || lower == "true" || lower == "yes" || lower == "on") return true;
  if (lower.empty() || lower == "0" || lower == "false" || lower == "no" || lower == "off") {
    return false;
  }
  throw UsageError(fmt::format("environment variable {}={} is not a boolean (use 1/0, true/false)",
                               name, *value));
}

}  // namespace ddp::env
