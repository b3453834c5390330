#pragma once
// ddprun --recovery step on one node (docs/recovery.md): a worker that exits abnormally is
// restarted alone, in place (same rank), while the others keep running; each such restart
// counts against --max-restarts. The agent hosts the job's store (the workers' MASTER_ADDR:
// MASTER_PORT, DDP_RECOVERY=step tells them not to host it), so it outlives any rank, and
// publishes every loss there (recovery_notice.hpp) before the replacement starts: survivors
// learn of it within their watcher's interval (RecoverableGroup) and the replacement joins the
// generation the loss opened.
//
// --recovery group (the default) is the whole-group restart the agent always did.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "ddp/launcher/root_cause.hpp"

namespace ddp {
class TcpStore;
}

namespace ddp::launcher {

enum class RecoveryMode { kGroup, kStep };

// "group" or "step"; anything else is a UsageError naming `source` (the flag or variable).
RecoveryMode parse_recovery_mode(const std::string& value, const std::string& source);

// The variable that tells workers ddprun hosts their store and publishes losses.
inline constexpr const char* kRecoveryEnvVar = "DDP_RECOVERY";

class StepRecovery {
 public:
  // Hosts the store on every interface at `port` (0: a free port). Throws NetworkError naming
  // the port when it cannot bind. Construct it after the agent blocked its signals: the
  // store's thread must inherit that mask.
  StepRecovery(uint16_t port, int max_restarts, int notice_fd);
  ~StepRecovery();

  uint16_t port() const;
  int restarts() const { return restarts_; }

  // AttemptSpec::replace_failed: with restarts left, publishes the loss of the failed rank and
  // returns the replacement's TORCHELASTIC_RESTART_COUNT; otherwise nullopt (the attempt then
  // fails and the agent reports it, without a group restart).
  std::optional<int> on_worker_failed(const WorkerFailure& failure);

 private:
  std::unique_ptr<TcpStore> store_;
  int max_restarts_;
  int notice_fd_;
  int restarts_ = 0;
  int64_t generation_ = 0;
};

}  // namespace ddp::launcher
