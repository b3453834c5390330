#pragma once
// The local agent: runs attempts of the worker group on this node and restarts the whole
// group after a failure, up to max_restarts times, raising TORCHELASTIC_RESTART_COUNT.
// Single node: ranks come from `rendezvous`, called once per attempt. Multi-node: from
// `membership` (membership.hpp), which also stops the workers when the set of nodes changes;
// such restarts do not count against max_restarts.

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launcher/membership.hpp"
#include "ddp/launcher/root_cause.hpp"
#include "ddp/launcher/signals.hpp"
#include "ddp/launcher/std_streams.hpp"
#include "ddp/launcher/step_recovery.hpp"
#include "ddp/launcher/worker_placement.hpp"
#include "ddp/launcher/world.hpp"

namespace ddp::launcher {

struct AgentOptions {
  std::string role = "default";
  std::string run_id = "none";
  int max_restarts = 0;
  std::vector<std::string> command;  // resolved argv of every worker
  // --recovery step with a Python program: the warm spare's argv (warm_spare.hpp); empty: none.
  std::vector<std::string> warm_spare_command;
  std::vector<std::string> base_env;  // "KEY=VALUE"
  bool set_omp_threads = false;
  std::optional<std::string> log_dir;
  StdSpec redirects;
  StdSpec tee;
  std::optional<std::vector<int>> local_ranks_filter;
  // --numa-binding and --virtual-local-rank; the CPUs of each local rank that --numa-binding
  // chose (empty: no binding), computed once before anything starts.
  WorkerPlacement placement;
  std::vector<std::vector<int>> worker_cpus;
  // --duplicate-stdout-filters / --duplicate-stderr-filters (launch_options.hpp).
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;
  std::chrono::milliseconds term_grace{30000};
  std::chrono::milliseconds monitor_interval{5000};
  // --signals-to-handle: caught and forwarded (signals.hpp); the others keep their default.
  std::vector<int> handled_signals = default_handled_signals();
  std::string host;
  int console_out = 1;
  int console_err = 2;
  int notice_fd = 2;
  // Stacks at the end of a failed attempt and `ddprun stacks` (worker_group.hpp,
  // stack_service.hpp); stacks_limit 0 turns the capture off.
  std::chrono::milliseconds stacks_limit{5000};
  bool serve_stacks = true;
  // --hang-timeout (hang_watchdog.hpp); unset: off.
  std::optional<std::chrono::milliseconds> hang_timeout;
  // --recovery step (step_recovery.hpp): set = a failed worker is restarted alone; unset =
  // group. One node: the agent hosts the workers' store at step_recovery->port (0: a free one).
  // Several: serve, host and port are taken from each round (node 0 serves at its master
  // port); max_restarts, restarts_used and notice_fd are the agent's own.
  std::optional<StepRecoveryOptions> step_recovery;
  // restart_count -> the world of that attempt.
  std::function<WorldAssignment(int restart_count)> rendezvous;
  // Multi-node: used instead of `rendezvous` when set. Not owned.
  Membership* membership = nullptr;
};

struct AgentResult {
  // 0 all workers succeeded; 1 failed after restarts; 128+signo interrupted;
  // kRequeueExitStatus (util/exit_status.hpp) the workers stopped on request and ask to be
  // started again.
  int exit_code = 0;
  int restart_count = 0;
  std::optional<FailureReport> failure;
  int signal = 0;
};

// Prints notices and the failure report to notice_fd; returns the outcome.
AgentResult run_agent(const AgentOptions& options);

}  // namespace ddp::launcher
