#pragma once
// The warm spare (docs/recovery.md, "The warm spare"): under --recovery step or shrink, when the
// workers run a Python program, each agent keeps one Python interpreter started ahead of need
// (`PYTHON -u -m ddp.warm_spare`, python/ddp/warm_spare.py) that has imported torch, PyTorch's
// DDP and ddp, and waits. A rank restarted in place runs in it: the agent sends it the rank's
// argv, environment and CPUs over a socket and the spare becomes the rank (its pid, process
// group and output pipes are the rank's from then on), so the survivors do not wait for a new
// interpreter to import torch (seconds) before they can heal the rank.
//
// Contracts:
// - The spare starts with the job's environment but no rank (AttemptRunner::start_spare); it is
//   a child of the agent like a worker (own process group, PR_SET_PDEATHSIG, pipes for its
//   output) and in the idle scheduling class where it can leave it again
//   (can_leave_idle_class).
// - take() never blocks for long: the message goes out within kWarmSpareSendTimeout or the
//   spare is given up (killed) and the caller starts the rank as a new process.
// - A spare whose interpreter failed (no ddp importable, say) has exited on its own: its last
//   stderr line says why (exit_reason), and the agent starts no other one in that attempt.

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launcher/process.hpp"

namespace ddp::launcher {

// The environment variable that names the spare's socket descriptor.
inline constexpr const char* kWarmSpareFdEnvVar = "DDP_WARM_SPARE_FD";
inline constexpr std::chrono::milliseconds kWarmSpareSendTimeout{2000};

// The spare's command for a worker command `worker_argv`, or empty when the workers do not
// run a Python program that ddprun starts itself (PYTHON -u SCRIPT, -m MODULE, or --run-path's
// -c): `{PYTHON, -u, -m, ddp.warm_spare}`.
std::vector<std::string> warm_spare_command(const std::vector<std::string>& worker_argv);

// The message that turns a spare into a worker (python/ddp/warm_spare.py decodes it).
std::string encode_warm_spare_message(const std::vector<std::string>& argv,
                                      const std::vector<std::string>& env,
                                      const std::vector<int>& cpus);

// Whether a process of this user can leave the idle scheduling class again (root,
// CAP_SYS_NICE, or RLIMIT_NICE allowing nice 0): only then is a spare started in it.
bool can_leave_idle_class();

class WarmSpare {
 public:
  // Starts a spare with `options` (argv from warm_spare_command, the spare's environment,
  // `idle_class` where can_leave_idle_class(); the socket descriptor and PYTHONSAFEPATH=1 are
  // added here). Throws ddp::Error like spawn_process.
  static WarmSpare start(SpawnOptions options);

  WarmSpare(WarmSpare&&) = default;
  WarmSpare& operator=(WarmSpare&&) = default;

  pid_t pid() const { return process_.pid; }

  // Whether the spare said its imports are done (a byte on the socket; checked without
  // waiting). A spare taken before that finishes them as the rank.
  bool warm();

  // Hands the spare `worker`'s argv, env and CPUs (an idle-class spare still importing is
  // moved to the normal class first). On success returns the process (the
  // spare's pid and output pipes), and this object is spent. nullopt when the spare could not
  // take it (it died; the message did not go out in time: then it is killed), with `why`.
  std::optional<SpawnedProcess> take(const SpawnOptions& worker, std::string& why);

  // SIGKILL to the spare's process group (the caller reaps it).
  void kill();

  // After the spare exited by itself: its exit status and the last line it wrote to stderr.
  std::string exit_reason(int wait_status);

 private:
  WarmSpare() = default;
  void leave_idle_class();
  SpawnedProcess process_;
  bool idle_ = false;
  UniqueFd socket_;  // the agent's end
  bool warm_ = false;
};

}  // namespace ddp::launcher
