// NcclOptions from the environment (the knobs users set on a cluster without recompiling).
#include <fmt/format.h>

#include "ddp/comm/nccl_process_group.hpp"
#include "ddp/util/env.hpp"
#include "ddp/util/error.hpp"

namespace ddp {

NcclOptions NcclOptions::from_env(std::chrono::milliseconds timeout) {
  NcclOptions options;
  options.timeout = timeout;
  options.blocking_wait = env::get_bool("DDP_NCCL_BLOCKING_WAIT", options.blocking_wait);
  if (const auto interval = env::get_int("DDP_NCCL_WATCHDOG_INTERVAL_MS")) {
    if (*interval <= 0) {
      throw UsageError(fmt::format(
          "DDP_NCCL_WATCHDOG_INTERVAL_MS={} must be a positive number of milliseconds", *interval));
    }
    options.watchdog_interval = std::chrono::milliseconds(*interval);
  }
  return options;
}

}  // namespace ddp
