#pragma once
// Named spdlog loggers for ddp components ("ddp.store", "ddp.launcher", ...).
//
// Each logger writes to stderr with the format "[time] [name] [level] message". The level
// comes from DDP_LOG_LEVEL (trace, debug, info, warn, error, critical, off; default info);
// a bad value is a UsageError naming the variable. Loggers are created on first use and
// shared (spdlog's registry), so every call site of one component logs through one object.

#include <spdlog/spdlog.h>

#include <memory>
#include <string>

namespace ddp::log {

// The logger named `name`, created on first use. Thread-safe.
std::shared_ptr<spdlog::logger> get(const std::string& name);

}  // namespace ddp::log
