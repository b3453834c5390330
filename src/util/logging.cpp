#include "ddp/util/logging.hpp"

#include <fmt/format.h>
#include <spdlog/sinks/stdout_color_sinks.h>

#include <mutex>

#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"

namespace ddp::log {

namespace {

spdlog::level::level_enum level_from_env() {
  std::string text = env::get_or("DDP_LOG_LEVEL", "info");
  auto level = spdlog::level::from_str(text);
  // from_str maps unknown names to "off"; only accept "off" when it was asked for.
  if (level == spdlog::level::off && text != "off") {
    throw UsageError(fmt::format(
        "DDP_LOG_LEVEL={} is not a log level; use trace, debug, info, warn, error or off", text));
  }
  return level;
}

}  // namespace

std::shared_ptr<spdlog::logger> get(const std::string& name) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (auto existing = spdlog::get(name)) return existing;
  auto logger = spdlog::stderr_color_mt(name);
  logger->set_pattern("[%Y-%m-%d %H:%M:%S.%e] [%n] [%l] %v");
  logger->set_level(level_from_env());
  return logger;
}

}  // namespace ddp::log
