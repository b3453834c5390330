#pragma once
// Everything ddprun's command line decides, as named fields. The CLI (cli.hpp) fills it from
// flags and PET_* variables; launch() (launch.hpp) turns it into an agent run.

#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launcher/signals.hpp"
#include "ddp/launcher/std_streams.hpp"
#include "ddp/launcher/worker_placement.hpp"

namespace ddp::launcher {

struct LaunchOptions {
  static constexpr const char* kDefaultMasterAddr = "127.0.0.1";
  static constexpr int kDefaultMasterPort = 29500;
  static constexpr const char* kDefaultRole = "default";

  // World shape. nnodes is the maximum node count; nnodes_min the minimum (they differ only
  // with --nnodes MIN:MAX, which needs the c10d backend).
  int nnodes = 1;
  int nnodes_min = 1;
  int node_rank = 0;
  int nproc_per_node = 1;  // resolved from N|auto|cpu|gpu

  // Multi-node rendezvous (docs/rendezvous.md). Used when nnodes > 1, an endpoint is given, or
  // the backend is c10d.
  std::string rdzv_backend = "static";       // "static" or "c10d"
  std::optional<std::string> rdzv_endpoint;  // HOST[:PORT]
  std::string rdzv_conf;                     // key=value,...
  // This node's address as the others should use it (MASTER_ADDR when it is node 0).
  std::optional<std::string> local_addr;
  // Which values the user gave (flag or PET_ variable): cluster detection fills only the rest.
  struct Given {
    bool nnodes = false;
    bool node_rank = false;
    bool master_addr = false;
    bool master_port = false;
    bool run_id = false;
    bool nproc_per_node = false;
    bool rdzv_backend = false;
  } given;

  // Where rank 0 of the workers hosts the TCPStore (PyTorch's env:// init).
  std::string master_addr = kDefaultMasterAddr;
  int master_port = kDefaultMasterPort;
  // --standalone: pick a free master port (by binding port 0) for every attempt and a random
  // run id.
  bool standalone = false;

  std::string role = kDefaultRole;
  std::string run_id = "none";
  int max_restarts = 0;
  // Accepted for torchrun compatibility. The agent is event driven and does not poll, so
  // this only bounds how long it sleeps without any event.
  double monitor_interval_s = 0.1;  // torchrun 2.13's default

  // Logs: DIR/<run_id>/attempt_<n>/<rank>/{stdout,stderr}.log, error.json. Unset: a temp
  // directory that is removed at exit.
  std::optional<std::string> log_dir;
  StdSpec redirects;
  StdSpec tee;
  // Local ranks whose output reaches the console; unset means all.
  std::optional<std::vector<int>> local_ranks_filter;

  // What each worker runs: PROGRAM ARGS... (a .py file runs under Python, -m runs a module,
  // --no-python execs PROGRAM directly).
  bool no_python = false;
  bool module = false;
  // --run-path: Python runs PROGRAM with runpy.run_path (torchrun's same-interpreter mode);
  // takes precedence over --no-python and --module, as in torchrun.
  bool run_path = false;
  std::string program;
  std::vector<std::string> program_args;

  // --numa-binding, --virtual-local-rank (worker_placement.hpp).
  WorkerPlacement placement;
  // --duplicate-stdout-filters / --duplicate-stderr-filters: lines of the tee'd streams that
  // contain any of these also go to ROOT/attempt_<n>/filtered_{stdout,stderr}.log.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  // --event-log-handler: "null" (and "dynamic_rendezvous") record nothing; "console" prints
  // the agent's final torchelastic event as a JSON line on stderr.
  std::string event_log_handler = "null";

  // --recovery group|step|shrink (step_recovery.hpp, docs/recovery.md): "step" restarts only a
  // failed worker; "shrink" too, and the others go on without it until it is back.
  bool recovery_step = false;  // step or shrink
  bool recovery_shrink = false;
  // --warm-spare auto|off (warm_spare.hpp): auto keeps a Python interpreter ready on each node
  // for a rank restarted in place, when the workers run a Python program under --recovery
  // step or shrink; off: a restarted rank is always a new process.
  bool warm_spare = true;

  // --hang-timeout SECONDS: the no-progress watchdog (hang_watchdog.hpp); unset: off.
  std::optional<std::chrono::milliseconds> hang_timeout;
  // DDPRUN_STACKS_TIMEOUT_S: limit of the stack capture before a stop (0: no capture).
  std::chrono::milliseconds stacks_limit{5000};

  // SIGTERM -> SIGKILL grace when stopping workers (torchrun: 30 s; --shutdown-timeout,
  // TORCH_ELASTIC_SHUTDOWN_TIMEOUT or DDPRUN_TERM_GRACE_S).
  std::chrono::milliseconds term_grace{30000};
  // --signals-to-handle: the signals ddprun catches and forwards (signals.hpp).
  std::vector<int> signals_to_handle = default_handled_signals();
  // Multi-node: time between the progress lines of a node waiting for the rendezvous
  // (DDPRUN_RDZV_PROGRESS_S); unset: kDefaultJoinProgressInterval (join_progress.hpp).
  std::optional<std::chrono::milliseconds> rdzv_progress_interval;
};

}  // namespace ddp::launcher
