#pragma once
// A process environment as a value, so cluster detection and the doctor can be tested with
// the variables SLURM, PBS or mpirun would set, without touching the real environment.

#include <map>
#include <optional>
#include <string>

namespace ddp::cluster {

using EnvMap = std::map<std::string, std::string>;

// A snapshot of this process's environment (environ).
EnvMap current_environment();

// The value of `name`, or nullopt when unset or empty (schedulers never set empty values
// on purpose, so an empty one is treated as absent).
std::optional<std::string> lookup(const EnvMap& env, const std::string& name);

// `name` parsed as a non-negative base-10 integer; nullopt when unset or empty. Garbage is a
// UsageError naming the variable and its value.
std::optional<int> lookup_int(const EnvMap& env, const std::string& name);

// This machine's host name (gethostname), never empty.
std::string local_hostname();

}  // namespace ddp::cluster
