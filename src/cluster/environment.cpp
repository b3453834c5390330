#include "ddp/cluster/environment.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>

#include "ddp/util/error.hpp"

namespace ddp::cluster {

EnvMap current_environment() {
  EnvMap env;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    std::string text(*entry);
    size_t eq = text.find('=');
    if (eq == std::string::npos) continue;
    env.emplace(text.substr(0, eq), text.substr(eq + 1));
  }
  return env;
}

std::optional<std::string> lookup(const EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  if (it == env.end() || it->second.empty()) return std::nullopt;
  return it->second;
}

std::optional<int> lookup_int(const EnvMap& env, const std::string& name) {
  auto value = lookup(env, name);
  if (!value) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  long parsed = std::strtol(value->c_str(), &end, 10);
  if (errno != 0 || end == value->c_str() || *end != '\0' || parsed < 0 || parsed > INT_MAX) {
    throw UsageError(fmt::format(
        "environment variable {}={} is not a non-negative integer: unset it or fix its value", name,
        *value));
  }
  return static_cast<int>(parsed);
}

std::string local_hostname() {
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace ddp::cluster
