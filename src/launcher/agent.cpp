#include "ddp/launcher/agent.hpp"

#include <fmt/format.h>

#include "ddp/launcher/output.hpp"
#include "ddp/launcher/run_directory.hpp"
#include "ddp/launcher/signals.hpp"
#include "ddp/launcher/worker_group.hpp"
#include "ddp/util/error.hpp"

namespace ddp::launcher {

namespace {

void notice(int fd, const std::string& text) {
  std::string line = "ddprun: " + text + "\n";
  write_fully(fd, line.data(), line.size());
}

}  // namespace

AgentResult run_agent(const AgentOptions& options) {
  if (!options.rendezvous) throw Error("run_agent: no rendezvous function given");
  if (options.command.empty()) throw Error("run_agent: no worker command given");

  // Signals are queued from here on, so none is lost between attempts.
  SignalChannel signals;
  RunDirectory run_dir(options.log_dir, options.run_id);

  for (int restart = 0;; ++restart) {
    WorldAssignment world = options.rendezvous(restart);

    AttemptSpec spec;
    spec.world = &world;
    spec.run_dir = &run_dir;
    spec.restart_count = restart;
    spec.max_restarts = options.max_restarts;
    spec.role = options.role;
    spec.run_id = options.run_id;
    spec.host = options.host;
    spec.command = options.command;
    spec.base_env = options.base_env;
    spec.set_omp_threads = options.set_omp_threads;
    spec.write_logs = run_dir.persistent();
    spec.redirects = options.redirects;
    spec.tee = options.tee;
    spec.local_ranks_filter = options.local_ranks_filter;
    spec.term_grace = options.term_grace;
    spec.monitor_interval = options.monitor_interval;
    spec.console_out = options.console_out;
    spec.console_err = options.console_err;
    spec.notice_fd = options.notice_fd;

    AttemptResult attempt = run_attempt(spec, signals);

    AgentResult result;
    result.restart_count = restart;
    switch (attempt.outcome) {
      case AttemptOutcome::kSucceeded:
        result.exit_code = 0;
        return result;
      case AttemptOutcome::kInterrupted:
        notice(options.notice_fd, fmt::format("stopped all workers after {}; exiting with {}",
                                              signal_name(attempt.signal), 128 + attempt.signal));
        result.exit_code = 128 + attempt.signal;
        result.signal = attempt.signal;
        return result;
      case AttemptOutcome::kFailed:
        break;
    }
    if (restart < options.max_restarts) {
      notice(options.notice_fd,
             fmt::format("{}; restarting the worker group (restart {} of {})",
                         describe_failure(*attempt.root_cause), restart + 1, options.max_restarts));
      continue;
    }
    FailureReport report;
    report.role = options.role;
    report.run_id = options.run_id;
    report.restart_count = restart;
    report.max_restarts = options.max_restarts;
    report.root_cause = *attempt.root_cause;
    report.others = attempt.others;
    std::string text = format_failure_report(report);
    write_fully(options.notice_fd, text.data(), text.size());
    result.exit_code = 1;
    result.failure = std::move(report);
    return result;
  }
}

}  // namespace ddp::launcher
