#include "ddp/launcher/launch.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>
#include <memory>

#include <algorithm>
#include <chrono>
#include <nlohmann/json.hpp>

#include "ddp/cluster/environment.hpp"
#include "ddp/launcher/agent.hpp"
#include "ddp/launcher/command.hpp"
#include "ddp/launcher/multi_node.hpp"
#include "ddp/launcher/output.hpp"
#include "ddp/launcher/root_cause.hpp"
#include "ddp/launcher/step_recovery.hpp"
#include "ddp/launcher/warm_spare.hpp"
#include "ddp/launcher/worker_env.hpp"
#include "ddp/launcher/worker_placement.hpp"
#include "ddp/launcher/world.hpp"
#include "ddp/rendezvous/options.hpp"
#include "ddp/store/auth.hpp"
#include "ddp/store/recovery_notice.hpp"
#include "ddp/util/error.hpp"
#include "ddp/util/socket.hpp"

namespace ddp::launcher {

namespace {

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown-host";
  return buf;
}

// --numa-binding reads the machine's topology once and computes every worker's CPUs now,
// so one that cannot be made is a usage error before anything starts; --virtual-local-rank
// needs a GPU in CUDA_VISIBLE_DEVICES for every worker.
void plan_placement(const LaunchOptions& o, AgentOptions& a, const EnvLookup& env) {
  if (o.placement.numa_binding) {
    const CpuTopology topology = read_cpu_topology("/sys", allowed_cpus());
    for (int r = 0; r < o.nproc_per_node; ++r) {
      const auto& cpus = a.worker_cpus.emplace_back(
          numa_cpus(*o.placement.numa_binding, r, o.nproc_per_node, topology));
      const std::string note =
          fmt::format("ddprun: --numa-binding {}: local rank {} runs on CPUs {}\n",
                      to_string(*o.placement.numa_binding), r, cpu_list_text(cpus));
      write_fully(2, note.data(), note.size());
    }
  }
  if (o.placement.virtual_local_rank) {
    virtual_visible_device(env("CUDA_VISIBLE_DEVICES"), o.nproc_per_node - 1);
  }
}

// --event-log-handler console: the agent's final event, as torchrun's launcher records it
// (torchelastic.worker.status.SUCCEEDED or FAILED, source AGENT), one JSON line on stderr.
int finish(const LaunchOptions& o, const AgentOptions& a, const AgentResult& result) {
  if (o.event_log_handler == "console") {
    const std::string state = result.exit_code == 0 ? "SUCCEEDED" : "FAILED";
    const auto now = std::chrono::system_clock::now().time_since_epoch();
    nlohmann::json event = {
        {"name", "torchelastic.worker.status." + state},
        {"source", "AGENT"},
        {"timestamp", std::chrono::duration_cast<std::chrono::milliseconds>(now).count()},
        {"metadata",
         {{"run_id", o.run_id},
          {"global_rank", nullptr},
          {"group_rank", nullptr},
          {"worker_id", nullptr},
          {"role", o.role},
          {"hostname", a.host},
          {"state", state},
          {"rdzv_backend", o.rdzv_backend},
          {"raw_error",
           result.failure ? nlohmann::json(describe_failure(result.failure->root_cause)) : nullptr},
          {"metadata", nlohmann::json({{"entry_point", o.program}})
                           .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)},
          {"agent_restarts", result.restart_count}}}};
    // Replace invalid UTF-8 (a program path, an error text) rather than throw at the end.
    const std::string line =
        event.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    write_fully(2, line.data(), line.size());
  }
  return result.exit_code;
}

}  // namespace

int launch(const LaunchOptions& options, const EnvLookup& env) {
  LaunchOptions o = options;
  if (!o.standalone) {
    // Inside an allocation the scheduler's variables fill what the flags leave out.
    for (const auto& line : apply_cluster_detection(o, cluster::current_environment())) {
      std::string text = "ddprun: " + line + "\n";
      write_fully(2, text.data(), text.size());
    }
  }
  AgentOptions a;
  a.command = worker_command(o, env);
  a.role = o.role;
  a.run_id = o.run_id;
  a.max_restarts = o.max_restarts;
  a.base_env = current_environment();
  a.log_dir = o.log_dir;
  a.redirects = o.redirects;
  a.tee = o.tee;
  a.local_ranks_filter = o.local_ranks_filter;
  a.placement = o.placement;
  a.duplicate_stdout_filters = o.duplicate_stdout_filters;
  a.duplicate_stderr_filters = o.duplicate_stderr_filters;
  plan_placement(o, a, env);
  a.term_grace = o.term_grace;
  a.handled_signals = o.signals_to_handle;
  // At least 10 ms, so a tiny interval cannot turn the event loop into a busy loop.
  a.monitor_interval =
      std::max(std::chrono::milliseconds(10),
               std::chrono::milliseconds(static_cast<int64_t>(o.monitor_interval_s * 1000)));
  a.host = host_name();
  a.hang_timeout = o.hang_timeout;
  a.stacks_limit = o.stacks_limit;

  a.set_omp_threads = o.nproc_per_node > 1 && !env("OMP_NUM_THREADS");
  if (a.set_omp_threads) {
    std::string note =
        "ddprun: setting OMP_NUM_THREADS=1 for every worker so several workers do not "
        "overload this node; set OMP_NUM_THREADS yourself to tune it\n";
    write_fully(2, note.data(), note.size());
  }
  if (!o.log_dir && (!o.redirects.per_rank.empty() || o.redirects.all != Std::kNone)) {
    std::string note =
        "ddprun: --redirects without --log-dir: redirected output is kept only in a temporary "
        "directory removed at exit; add --log-dir DIR to keep it\n";
    write_fully(2, note.data(), note.size());
  }

  if (o.recovery_step) {
    // An agent hosts the workers' store (step_recovery.hpp). One node: the fixed
    // --master-port, or a free one with --standalone. Several: each round's (run_multi_node).
    StepRecoveryOptions step;
    step.port = static_cast<uint16_t>(o.standalone ? 0 : o.master_port);
    step.max_restarts = o.max_restarts;
    step.notice_fd = a.notice_fd;
    step.shrink = o.recovery_shrink;
    a.step_recovery = step;
    set_env_entry(a.base_env, kRecoveryEnvVar, "step");
    // PyTorch's gloo connects every pair of ranks in init_process_group; a replacement's
    // peers re-formed long ago and never answer there (ddp.StepManager gives each generation a
    // group of its own: python/ddp/torch_generations.py). Lazily, a group connects when used.
    bool lazy_set = false;
    for (const auto& entry : a.base_env) lazy_set |= entry.rfind("TORCH_GLOO_LAZY_INIT=", 0) == 0;
    if (!lazy_set) set_env_entry(a.base_env, "TORCH_GLOO_LAZY_INIT", "1");
    if (o.warm_spare) a.warm_spare_command = warm_spare_command(a.command);
  }

  std::unique_ptr<Membership> membership;
  if (is_multi_node(o)) {
    // Signals are not blocked yet: the membership starts no thread before the agent's first
    // next_round() (rendezvous_membership.hpp).
    RendezvousMembershipOptions settings = rendezvous_settings(o, a.host);
    settings.notice_fd = 2;
    // Without a token the job's stores answer anyone who reaches them (docs/security.md).
    if (!settings.token && !rdzv::uses_etcd(settings.rdzv.backend) &&
        store_auth::resolve_token(std::nullopt).empty()) {
      const std::string note = fmt::format(
          "ddprun: warning: this multi-node job's stores have no token: anyone who can reach "
          "{}:{} (or another store of the job) can read and write its keys, join the job, or "
          "replace what a replica holds; give every node --rdzv-conf token_file=FILE (the same "
          "secret, mode 600; docs/security.md)\n",
          settings.rdzv.endpoint.host, settings.rdzv.endpoint.port);
      write_fully(2, note.data(), note.size());
    }
    if (o.rdzv_progress_interval) settings.progress_interval = *o.rdzv_progress_interval;
    if (settings.rdzv.conf.token_file) {
      // The job's token guards the stores ddp opens inside the workers too (rank 0's
      // MASTER_ADDR:MASTER_PORT store, server and clients): they read it from this file.
      // The path, not the secret, goes into the environment.
      set_env_entry(a.base_env, store_auth::kTokenFileEnvVar,
                    std::filesystem::absolute(*settings.rdzv.conf.token_file).string());
    }
    // The job's token guards the step-recovery store too, as every store of the job.
    if (a.step_recovery && settings.token) a.step_recovery->token = settings.token;
    if (a.step_recovery) {
      // Nodes 1..standby_stores keep standbys of the step store, so it outlives node 0.
      a.step_recovery->standby_count = settings.rdzv.conf.standby_stores;
      a.step_recovery->local_addr = settings.rdzv.local_addr;
    }
    if (a.step_recovery) {
      // A lost node is announced once its heartbeats were missed: the workers whose collective
      // failed on its closed sockets wait that long, and a margin, for the notice.
      const auto wait =
          settings.rdzv.conf.heartbeat * (rdzv::kMissedHeartbeats + 1) + std::chrono::seconds(5);
      set_env_entry(a.base_env, recovery_notice::kNoticeWaitEnvVar, std::to_string(wait.count()));
    }
    membership = make_rendezvous_membership(std::move(settings));
    a.membership = membership.get();
    return finish(o, a, run_agent(a));
  }

  StaticWorldOptions world;
  world.node_rank = o.node_rank;
  world.nnodes = o.nnodes;
  world.nproc_per_node = o.nproc_per_node;
  world.master_addr = o.master_addr;
  world.master_port = o.master_port;
  bool fresh_port = o.standalone;
  // Validate now, so bad numbers are a usage error before anything starts.
  assign_static_world(world);
  a.rendezvous = [world, fresh_port](int /*restart_count*/) {
    StaticWorldOptions w = world;
    // A fresh port per attempt: the previous attempt's TCPStore port may linger in TIME_WAIT.
    // Every interface, as the store will bind, so "free" means free for it.
    if (fresh_port) w.master_port = net::free_tcp_port("");
    return assign_static_world(w);
  };
  return finish(o, a, run_agent(a));
}

}  // namespace ddp::launcher
