#include "ddp/launcher/step_recovery.hpp"

#include <fmt/format.h>

#include "ddp/launcher/output.hpp"
#include "ddp/store/recovery_notice.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"

namespace ddp::launcher {

namespace {
// Set by the agent serving the step store, so the other nodes' agents know it is one.
constexpr const char* kServedByAgentKey = "ddp/recovery/served_by_agent";
// How long another node's agent waits for that key (the serving agent sets it right after the
// round, as the others connect).
constexpr std::chrono::seconds kServedByAgentWait{30};
}  // namespace

RecoveryMode parse_recovery_mode(const std::string& value, const std::string& source) {
  if (value == "group") return RecoveryMode::kGroup;
  if (value == "step") return RecoveryMode::kStep;
  throw UsageError(fmt::format(
      "{} '{}': unknown recovery mode; use 'group' (stop every worker and restart the group, "
      "the default) or 'step' (restart only the failed worker; the others drop the step in "
      "flight and go on, see docs/recovery.md)",
      source, value));
}

StepRecovery::StepRecovery(const StepRecoveryOptions& options)
    : max_restarts_(options.max_restarts),
      notice_fd_(options.notice_fd),
      restarts_(options.restarts_used) {
  TcpStoreOptions o;
  // A server's client side talks to it over loopback; it binds every interface.
  o.host = options.serve ? "127.0.0.1" : options.host;
  o.port = options.port;
  o.is_server = options.serve;
  o.token = options.token;
  o.timeout = options.timeout;
  try {
    store_ = std::make_unique<TcpStore>(o);
  } catch (const Error& e) {
    if (options.serve) throw;
    throw NetworkError(fmt::format(
        "--recovery step: cannot reach the job's store at {}, which the agent of the node "
        "running rank 0 hosts (is that agent running, and is the port open between the "
        "nodes?): {}",
        net::format_endpoint(options.host, options.port), e.what()));
  }
  if (options.serve) {
    store_->set(kServedByAgentKey, "1");
  } else {
    // A node 0 started without --recovery step serves no step store: its rank 0 worker hosts
    // one at the same address, which this agent would otherwise take for the job's.
    // (That store may also close the connection: its worker fails without the others.)
    try {
      store_->wait({kServedByAgentKey}, kServedByAgentWait);
    } catch (const Error& e) {
      throw UsageError(fmt::format(
          "--recovery step: the store at {} did not show within {} s that a ddprun --recovery "
          "step agent serves it ({}): the node running rank 0 runs without --recovery step; "
          "give every node the same --recovery",
          net::format_endpoint(options.host, options.port),
          std::chrono::duration_cast<std::chrono::seconds>(kServedByAgentWait).count(), e.what()));
    }
  }
  recovery_notice::read_generation(*store_);  // generation 0, readable before any worker runs
}

StepRecovery::~StepRecovery() = default;

uint16_t StepRecovery::port() const {
  return store_->port();
}

std::optional<int> StepRecovery::on_worker_failed(const WorkerFailure& failure) {
  const std::string what = describe_failure(failure);
  if (restarts_ >= max_restarts_) {
    std::string line = fmt::format(
        "ddprun: {}; no restart left (--max-restarts {}), stopping the job\n", what, max_restarts_);
    write_fully(notice_fd_, line.data(), line.size());
    return std::nullopt;
  }
  const int64_t generation = recovery_notice::publish_lost_rank(*store_, failure.global_rank);
  ++restarts_;
  std::string line = fmt::format(
      "ddprun: {}; restarting only rank {} (--recovery step, restart {} of {}, membership "
      "generation {}); the other workers go on\n",
      what, failure.global_rank, restarts_, max_restarts_, generation);
  write_fully(notice_fd_, line.data(), line.size());
  return restarts_;
}

}  // namespace ddp::launcher
