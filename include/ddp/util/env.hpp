#pragma once
// Reading the process environment with typed, validated accessors. A malformed value is a
// UsageError that names the variable and the value, never a silent default.

#include <cstdint>
#include <optional>
#include <string>

namespace ddp::env {

// The variable's value, or nullopt when unset. An empty value counts as set.
std::optional<std::string> get(const char* name);

// The variable's value, or `fallback` when unset or empty.
std::string get_or(const char* name, const std::string& fallback);

// The variable parsed as a base-10 integer, or nullopt when unset or empty.
// Throws UsageError("NAME=... is not an integer") on garbage.
std::optional<int64_t> get_int(const char* name);

// "1", "true", "yes", "on" (any case) are true; "0", "false", "no", "off" and empty are false;
// anything else is a UsageError. Unset gives `fallback`.
bool get_bool(const char* name, bool fallback);

}  // namespace ddp::env
