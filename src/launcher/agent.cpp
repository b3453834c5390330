#include "ddp/launcher/agent.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <thread>

#include "ddp/launcher/hang_report.hpp"
#include "ddp/launcher/output.hpp"
#include "ddp/launcher/process.hpp"
#include "ddp/launcher/run_directory.hpp"
#include "ddp/launcher/signals.hpp"
#include "ddp/launcher/stack_service.hpp"
#include "ddp/launcher/stack_tracer.hpp"
#include "ddp/launcher/stacks.hpp"
#include "ddp/launcher/step_recovery.hpp"
#include "ddp/launcher/torch_progress.hpp"
#include "ddp/launcher/worker_env.hpp"
#include "ddp/launcher/worker_group.hpp"
#include "ddp/store/recovery_notice.hpp"
#include "ddp/store/tcp_store.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/exit_status.hpp"

namespace ddp::launcher {

namespace {

void notice(int fd, const std::string& text) {
  std::string line = "ddprun: " + text + "\n";
  write_fully(fd, line.data(), line.size());
}

// What the agent holds for the stack capture and the watchdog across attempts.
struct Diagnostics {
  StackTools tools;
  std::unique_ptr<StackService> service;  // null when it could not start (said so)
  std::string python_hook_dir;            // "" without --hang-timeout
};

Diagnostics start_diagnostics(const AgentOptions& options, const RunDirectory& run_dir) {
  Diagnostics d;
  // pip puts py-spy beside the interpreter the workers run.
  std::vector<std::string> dirs;
  if (!options.command.empty()) {
    const std::string& exe = options.command.front();
    if (exe.find('/') != std::string::npos) dirs.push_back(exe.substr(0, exe.rfind('/')));
  }
  d.tools = find_stack_tools(dirs);
  if (!d.tools.py_spy.empty() || !d.tools.eu_stack.empty()) {
    std::string why;
    d.tools.tracer = StackTracer::start(d.tools, &why);
    if (!d.tools.tracer) {
      notice(options.notice_fd,
             "the stack tracer process did not start (" + why +
                 "); the stack tools run from the agent, and the workers let it trace them");
    }
  }
  if (options.serve_stacks) {
    try {
      StackServiceOptions so;
      so.run_id = options.run_id;
      so.host = options.host;
      if (run_dir.persistent()) so.log_root = run_dir.root();
      so.tools = d.tools;
      d.service = std::make_unique<StackService>(std::move(so));
    } catch (const Error& e) {
      notice(options.notice_fd,
             std::string("'ddprun stacks' will not reach this node: ") + e.what());
    }
  }
  if (options.hang_timeout) d.python_hook_dir = write_python_hook(run_dir.root());
  return d;
}

AttemptSpec make_spec(const AgentOptions& options, const WorldAssignment& world,
                      const RunDirectory& run_dir, int restart_count, int attempt,
                      const Diagnostics& diagnostics) {
  AttemptSpec spec;
  spec.world = &world;
  spec.run_dir = &run_dir;
  spec.restart_count = restart_count;
  spec.attempt = attempt;
  spec.max_restarts = options.max_restarts;
  spec.role = options.role;
  spec.run_id = options.run_id;
  spec.host = options.host;
  spec.command = options.command;
  spec.warm_spare_command = options.warm_spare_command;
  spec.base_env = options.base_env;
  spec.set_omp_threads = options.set_omp_threads;
  spec.write_logs = run_dir.persistent();
  spec.redirects = options.redirects;
  spec.tee = options.tee;
  spec.local_ranks_filter = options.local_ranks_filter;
  spec.placement = options.placement;
  spec.worker_cpus = options.worker_cpus;
  spec.duplicate_stdout_filters = options.duplicate_stdout_filters;
  spec.duplicate_stderr_filters = options.duplicate_stderr_filters;
  spec.term_grace = options.term_grace;
  spec.monitor_interval = options.monitor_interval;
  spec.console_out = options.console_out;
  spec.console_err = options.console_err;
  spec.notice_fd = options.notice_fd;
  spec.stacks_limit = options.stacks_limit;
  spec.stack_tools = diagnostics.tools;
  spec.stack_service = diagnostics.service.get();
  spec.hang_timeout = options.hang_timeout;
  spec.python_hook_dir = diagnostics.python_hook_dir;
  return spec;
}

// After a failed attempt: the hang report from the workers' flight recorder dumps, which they
// write into the attempt folder (worker_group.cpp sets DDP_FLIGHT_RECORDER_DIR; without
// --log-dir that folder is in ddprun's temporary ROOT, removed when ddprun exits). Prints
// nothing when no rank wrote a record.
void print_hang_report(int fd, const RunDirectory& run_dir, const AttemptResult& attempt) {
  const std::string& dir = attempt.flight_recorder_dir;
  if (dir.empty()) return;  // the user chose where the dumps go; `ddprun trace` reads them
  const std::vector<std::string> lines = hang_report_for_directory(dir, attempt.processes);
  if (lines.empty()) return;
  for (const auto& line : lines) notice(fd, line);
  if (run_dir.persistent()) {
    notice(fd, fmt::format("flight recorder dumps are in {} ('ddprun trace {}' prints this again)",
                           dir, dir));
  } else {
    notice(fd, fmt::format("flight recorder dumps are in {}, a temporary folder removed when "
                           "ddprun exits; pass --log-dir DIR to keep them for 'ddprun trace'",
                           dir));
  }
}

// Multi-node: the hang report over every node's records, exchanged through the rendezvous
// store. A node whose workers failed waits up to kShareWait for the others' records; a node
// stopped by a membership change publishes its own and reports only when its workers wrote
// dumps (a hang), else it moves on at once (a node joining is not a hang).
constexpr std::chrono::milliseconds kShareWait{5000};

void share_hang_report(const AgentOptions& options, Membership& m, const RunDirectory& run_dir,
                       int generation, const AttemptResult& attempt) {
  const std::string& dir = attempt.flight_recorder_dir;
  if (dir.empty()) return;
  const std::string mine = encode_node_records(dir, attempt.processes, options.host);
  const bool failed = attempt.outcome == AttemptOutcome::kFailed;
  const bool local_dumps = !hang_report_for_directory(dir).empty();
  const auto records = m.exchange_hang_records(
      generation, mine, failed || local_dumps ? kShareWait : std::chrono::milliseconds(0));
  if (!failed && !local_dumps) return;
  const std::vector<std::string> lines = hang_report_for_nodes(records);
  if (lines.empty()) return;
  for (const auto& line : lines) notice(options.notice_fd, line);
  size_t answered = 0;
  for (const auto& r : records) answered += r.empty() ? 0 : 1;
  notice(options.notice_fd,
         fmt::format("hang report from {} of {} nodes; this node's flight recorder dumps are in "
                     "{}{}",
                     answered, records.size(), dir,
                     run_dir.persistent() ? ""
                                          : " (a temporary folder removed when ddprun exits; "
                                            "pass --log-dir DIR to keep them)"));
}

AgentResult report_failure(const AgentOptions& options, const AttemptResult& attempt, int restart) {
  FailureReport report;
  report.role = options.role;
  report.run_id = options.run_id;
  report.restart_count = restart;
  report.max_restarts = options.max_restarts;
  report.root_cause = *attempt.root_cause;
  report.others = attempt.others;
  report.stacks_summary = stacks_summary(attempt.stacks);
  report.stacks_file = attempt.stacks_file;
  report.stacks_file_kept = options.log_dir.has_value();  // else ~RunDirectory removes it
  std::string text = format_failure_report(report);
  write_fully(options.notice_fd, text.data(), text.size());
  AgentResult result;
  result.exit_code = 1;
  result.restart_count = restart;
  result.failure = std::move(report);
  return result;
}

// The workers stopped on request and asked to be started again (util/exit_status.hpp): no
// restart here, the job script requeues the job.
AgentResult requeue_result(const AgentOptions& options, const AttemptResult& attempt,
                           int restarts) {
  notice(options.notice_fd,
         fmt::format("the workers stopped on request{} and ask to be started again later; "
                     "exiting with {} (requeue)",
                     attempt.signal != 0 ? " after " + signal_name(attempt.signal) : "",
                     kRequeueExitStatus));
  AgentResult result;
  result.exit_code = kRequeueExitStatus;
  result.restart_count = restarts;
  result.signal = attempt.signal;
  return result;
}

AgentResult run_single_node(const AgentOptions& options) {
  // Signals are queued from here on, so none is lost between attempts.
  SignalChannel signals(options.handled_signals);
  RunDirectory run_dir(options.log_dir, options.run_id);
  // After the signal mask: the service's threads inherit it and leave signals to the loop.
  Diagnostics diagnostics = start_diagnostics(options, run_dir);
  // --recovery step: after the signal mask too (its store serves on a thread).
  std::optional<StepRecovery> step;
  if (options.step_recovery) step.emplace(*options.step_recovery);

  for (int restart = 0;; ++restart) {
    WorldAssignment world = options.rendezvous(restart);
    if (step) world.master_port = step->port();
    AttemptSpec spec = make_spec(options, world, run_dir, restart, restart, diagnostics);
    if (step) {
      spec.replace_failed = [&step](const WorkerFailure& f, bool a_peer_finished) {
        return step->on_worker_failed(f, a_peer_finished);
      };
      spec.on_worker_succeeded = [&step](int rank) { step->on_worker_succeeded(rank); };
    }
    AttemptResult attempt = run_attempt(spec, signals);
    if (step) restart = step->restarts();  // restarts in place count against --max-restarts

    AgentResult result;
    result.restart_count = restart;
    switch (attempt.outcome) {
      case AttemptOutcome::kSucceeded:
      case AttemptOutcome::kStopped:  // no stop_fd here, so it cannot happen
        result.exit_code = 0;
        return result;
      case AttemptOutcome::kInterrupted:
        notice(options.notice_fd, fmt::format("stopped all workers after {}; exiting with {}",
                                              signal_name(attempt.signal), 128 + attempt.signal));
        result.exit_code = 128 + attempt.signal;
        result.signal = attempt.signal;
        return result;
      case AttemptOutcome::kRequeue:
        return requeue_result(options, attempt, restart);
      case AttemptOutcome::kFailed:
        break;
    }
    print_hang_report(options.notice_fd, run_dir, attempt);
    if (step && step->group_restart()) {
      // Workers that are not recovery-aware (step_recovery.hpp): a new group with a new store.
      StepRecoveryOptions s = *options.step_recovery;
      s.restarts_used = step->restarts() + 1;
      step.reset();
      step.emplace(s);
      continue;
    }
    if (restart < options.max_restarts && !step) {
      notice(options.notice_fd,
             fmt::format("{}; restarting the worker group (restart {} of {})",
                         describe_failure(*attempt.root_cause), restart + 1, options.max_restarts));
      continue;
    }
    return report_failure(options, attempt, restart);
  }
}

// Runs membership.next_round() on a helper thread while this thread watches the signal
// channel, so Ctrl-C during a long rendezvous wait is honoured at once. On a terminating
// signal the process exits (the helper is blocked in the store and cannot be joined), after
// removing the temporary run directory, which no destructor will.
MembershipRound join_round(Membership& membership, SignalChannel& signals, int notice_fd,
                           RunDirectory& run_dir) {
  struct Shared {
    std::mutex mutex;
    std::optional<MembershipRound> round;
    std::exception_ptr error;
  };
  auto shared = std::make_shared<Shared>();
  int raw[2];
  if (::pipe2(raw, O_CLOEXEC) != 0) {
    throw Error(fmt::format("cannot create a pipe for the rendezvous: {}", std::strerror(errno)));
  }
  UniqueFd done_read(raw[0]), done_write_fd(raw[1]);
  int done_write = done_write_fd.get();
  std::thread helper([&membership, shared, done_write] {
    try {
      MembershipRound r = membership.next_round();
      std::lock_guard<std::mutex> lock(shared->mutex);
      shared->round = std::move(r);
    } catch (...) {
      std::lock_guard<std::mutex> lock(shared->mutex);
      shared->error = std::current_exception();
    }
    char byte = 1;
    (void)!::write(done_write, &byte, 1);
  });
  for (;;) {
    pollfd fds[2] = {{done_read.get(), POLLIN, 0}, {signals.fd(), POLLIN, 0}};
    int n = ::poll(fds, 2, -1);
    if (n < 0 && errno != EINTR) {
      helper.detach();
      throw Error(fmt::format("poll failed: {}", std::strerror(errno)));
    }
    if (fds[0].revents != 0) break;
    if (fds[1].revents != 0) {
      for (int sig : signals.drain()) {
        if (!is_terminating_signal(sig)) continue;
        notice(notice_fd, fmt::format("received {} while waiting for the rendezvous; exiting "
                                      "with {}",
                                      signal_name(sig), 128 + sig));
        run_dir.remove_temporary();
        std::_Exit(128 + sig);
      }
    }
  }
  helper.join();
  std::lock_guard<std::mutex> lock(shared->mutex);
  if (shared->error) std::rethrow_exception(shared->error);
  return std::move(*shared->round);
}

AgentResult run_multi_node(const AgentOptions& options) {
  Membership& m = *options.membership;
  SignalChannel signals(options.handled_signals);
  RunDirectory run_dir(options.log_dir, options.run_id);
  Diagnostics diagnostics = start_diagnostics(options, run_dir);

  int charged = 0;   // restarts counted against max_restarts
  int restarts = 0;  // restarts after a failure of this node's workers, charged or not: the
                     // workers' TORCHELASTIC_RESTART_COUNT (torchrun's count, not the round's
                     // generation, which a node joining a running job sees above 0)
  std::optional<AttemptResult> failed;
  int failed_nodes = 0;
  int step_restarts = 0;  // --recovery step: workers this agent restarted alone
  // --recovery step: the round's StepRecovery while it exists (the watcher thread hands it lost
  // nodes; set after it is built, cleared before it goes, while the watcher is stopped).
  std::atomic<StepRecovery*> live_step{nullptr};
  if (options.step_recovery) {
    m.set_lost_node_handler([&live_step](const LostNode& node) {
      StepRecovery* step = live_step.load();
      return step != nullptr && step->on_node_lost(node);
    });
  }
  for (;;) {
    MembershipRound round = join_round(m, signals, options.notice_fd, run_dir);
    notice(options.notice_fd, round.summary);
    if (failed) {
      if (round.world.group_world_size < failed_nodes) {
        notice(options.notice_fd,
               fmt::format("the round has {} nodes instead of {}: a node was lost, so this "
                           "restart does not count against --max-restarts",
                           round.world.group_world_size, failed_nodes));
      } else if (++charged > options.max_restarts) {
        std::string why =
            fmt::format("{} on {} after {} restart{}", describe_failure(*failed->root_cause),
                        options.host, charged - 1, charged - 1 == 1 ? "" : "s");
        m.shut_down(why);
        return report_failure(options, *failed, charged - 1);
      } else {
        notice(options.notice_fd, fmt::format("restarting the worker group (restart {} of {})",
                                              charged, options.max_restarts));
      }
      failed.reset();
      ++restarts;
    }

    AttemptSpec spec =
        make_spec(options, round.world, run_dir, restarts, round.generation, diagnostics);
    if (diagnostics.service) {
      // Other nodes' `ddprun stacks` requests reach this one through the job's store.
      try {
        std::shared_ptr<Store> side = m.connect_side_store();
        diagnostics.service->join_round(side, round.generation, round.world.group_rank,
                                        round.world.group_world_size,
                                        side ? "" : m.why_no_side_store());
      } catch (const Error& e) {
        notice(options.notice_fd,
               std::string("'ddprun stacks' on other nodes will not reach this one: ") + e.what());
      }
    }
    spec.stop_fd = m.start_watching();
    // --recovery step: this round's store (node 0 hosts it at the round's master port, where
    // the workers meet), after the signal mask (its server thread inherits it), and while
    // watching: the membership's heartbeats go on while another node's agent waits up to
    // StepRecovery::kServingAgentWait for node 0's, so node 0 does not take this node for lost
    // and leave the round before this one can end the job with the reason.
    std::optional<StepRecovery> step;
    if (options.step_recovery) {
      StepRecoveryOptions s = *options.step_recovery;
      s.serve = round.world.group_rank == 0;
      s.host = round.world.master_addr;
      s.port = static_cast<uint16_t>(round.world.master_port);
      s.restarts_used = step_restarts;
      // The slots every worker counts from: the launch's, also on a node that grew the job.
      s.world_size = round.launch_world_size > 0 ? round.launch_world_size : round.world.world_size;
      s.node_rank = round.world.group_rank;
      // A node that grew the round keeps no standby store (those are nodes 1..standby_stores
      // of the round as it formed); it reads their list like the others.
      s.num_nodes = round.formed_nodes > 0 ? round.formed_nodes : round.world.group_world_size;
      s.took_lost_slot = round.took_lost_slot;
      try {
        step.emplace(s);
        // The workers' store clients go on with a promoted standby if node 0 is lost.
        set_env_entry(spec.base_env, kStandbysEnvVar, step->standbys());
        set_env_entry(spec.base_env, recovery_notice::kLaunchWorldSizeEnvVar,
                      std::to_string(s.world_size));
        if (round.took_lost_slot || round.grew_round) {
          step->on_node_joined(round.world.group_rank, round.world.workers.front().global_rank,
                               round.world.local_world_size, round.grew_round);
        }
        live_step = &*step;
      } catch (const Error& e) {
        std::string why = fmt::format("{} (on {})", e.what(), options.host);
        m.stop_watching();
        if (round.took_lost_slot || round.grew_round) {
          // The job runs without this node: leaving costs it nothing (its heartbeats stop, the
          // round takes the place as lost); shutting the run down would end it.
          throw Error(
              fmt::format("{}; this node could not {} node {}, the job goes on without it", why,
                          round.took_lost_slot ? "take the place of" : "join the running job as",
                          round.world.group_rank));
        }
        m.shut_down(why);
        throw Error(why);
      }
      spec.replace_failed = [&step](const WorkerFailure& f, bool a_peer_finished) {
        return step->on_worker_failed(f, a_peer_finished);
      };
      spec.on_worker_succeeded = [&step](int rank) { step->on_worker_succeeded(rank); };
    }
    // --recovery group: the round ends as soon as this node has a root cause, before its other
    // workers are stopped (and the other nodes' workers lose their peers and fail too).
    std::string early_reason;  // as this node gave it; "" when it did not, or it failed
    if (!step) {
      spec.on_root_cause = [&](const std::string& cause) {
        const std::string why = fmt::format("{} on {}", cause, options.host);
        // The other nodes answer this node's stacks request before they leave the round.
        if (diagnostics.service && spec.stacks_limit.count() > 0) {
          diagnostics.service->reserve_request();
        }
        if (m.end_round_while_watching(why)) early_reason = why;
      };
    }
    AttemptResult attempt;
    try {
      attempt = run_attempt(spec, signals);
    } catch (...) {
      m.stop_watching();
      live_step = nullptr;
      throw;
    }
    std::optional<std::string> reason = m.stop_watching();
    live_step = nullptr;
    if (diagnostics.service) diagnostics.service->leave_round();
    if (step) step_restarts = step->restarts();

    AgentResult result;
    result.restart_count = charged + step_restarts;
    switch (attempt.outcome) {
      case AttemptOutcome::kSucceeded:
        m.finished();
        return result;
      case AttemptOutcome::kRequeue:  // every node's workers stop at the same agreed step
        m.finished();
        return requeue_result(options, attempt, charged);
      case AttemptOutcome::kInterrupted:
        m.leave(fmt::format("the agent on {} was stopped by {}", options.host,
                            signal_name(attempt.signal)));
        notice(options.notice_fd, fmt::format("stopped all workers after {}; exiting with {}",
                                              signal_name(attempt.signal), 128 + attempt.signal));
        result.exit_code = 128 + attempt.signal;
        result.signal = attempt.signal;
        return result;
      case AttemptOutcome::kStopped:
        notice(options.notice_fd,
               fmt::format("membership changed ({}); stopped the workers, joining the next round",
                           reason.value_or("no reason given")));
        share_hang_report(options, m, run_dir, round.generation, attempt);
        m.finish_if_shut_down();  // then the next round refuses to form and says why
        continue;
      case AttemptOutcome::kFailed: {
        std::string why =
            fmt::format("{} on {}", describe_failure(*attempt.root_cause), options.host);
        if (step && step->removed_from_job()) {
          // Another node's agent took this node for lost and the job went on without it: leave
          // without a word to the round (leaving ends it for everyone).
          notice(options.notice_fd,
                 "this node was declared lost and the job went on without it; exiting");
          return report_failure(options, attempt, step_restarts);
        }
        if (step && !step->group_restart()) {
          // No restart left, or a second worker failed after another exited: as on one node,
          // --recovery step does not fall back to a group restart (unless no worker runs a
          // StepManager: then below, as --recovery group). The job ends.
          m.shut_down(why);
          share_hang_report(options, m, run_dir, round.generation, attempt);
          return report_failure(options, attempt, step_restarts);
        }
        // First: the other nodes stop their workers and share their records. A round another
        // node ended before this one's root cause: that node's failure came first, and this
        // node's workers most likely failed because they lost their peers (a connection
        // closed): reported as that node's, as when the round ends before a local failure.
        const std::string first = m.end_round(why);
        if (!first.empty() && first != why && first != early_reason) {
          notice(options.notice_fd,
                 fmt::format("membership changed ({}); this node's workers failed after it ({}), "
                             "most likely for losing their peers; joining the next round",
                             first, why));
          share_hang_report(options, m, run_dir, round.generation, attempt);
          m.finish_if_shut_down();
          continue;
        }
        notice(options.notice_fd, why + "; every node re-joins the rendezvous");
        share_hang_report(options, m, run_dir, round.generation, attempt);
        failed = std::move(attempt);
        failed_nodes = round.world.group_world_size;
        continue;
      }
    }
  }
}

}  // namespace

AgentResult run_agent(const AgentOptions& options) {
  if (!options.rendezvous && options.membership == nullptr) {
    throw Error("run_agent: no rendezvous function or membership given");
  }
  if (options.command.empty()) throw Error("run_agent: no worker command given");
  return options.membership != nullptr ? run_multi_node(options) : run_single_node(options);
}

}  // namespace ddp::launcher
