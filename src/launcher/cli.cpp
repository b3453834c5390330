// ddprun's command line (parse_command_line): the flags and subcommands, and what each value
// becomes in LaunchOptions. Reading and checking one value: cli_values.cpp; the worker count of
// --nproc-per-node: nproc_per_node.cpp.
#include "ddp/launcher/cli.hpp"

#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <map>
#include <random>

#include "cli_values.hpp"
#include "ddp/launcher/signals.hpp"
#include "ddp/launcher/step_recovery.hpp"
#include "ddp/rendezvous/options.hpp"
#include "ddp/util/error.hpp"
#include "ddp/version.hpp"

namespace ddp::launcher {

using namespace detail;

namespace {

std::string random_run_id() {
  std::random_device rd;
  std::uniform_int_distribution<uint32_t> dist;
  uint32_t a = dist(rd), b = dist(rd), c = dist(rd), d = dist(rd);
  // uuid4-shaped, like torchrun's --standalone run id.
  return fmt::format("{:08x}-{:04x}-4{:03x}-{:04x}-{:04x}{:08x}", a, b >> 16, b & 0xfff,
                     0x8000 | (c >> 18), c & 0xffff, d);
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

ParsedCommandLine parse_command_line(const std::vector<std::string>& args, const EnvLookup& env) {
  CLI::App app{
      "ddprun [flags] PROGRAM [ARGS...]   or   ddprun doctor [--rdzv-endpoint "
      "HOST:PORT]   or   ddprun trace FILES...\n\nddprun: torchrun's command line in C++. Starts "
      "PROGRAM once per worker with RANK, "
      "WORLD_SIZE, MASTER_ADDR, ... set; restarts the group on failure.",
      "ddprun"};
  app.prefix_command();  // everything from PROGRAM on belongs to the program
  app.set_version_flag("--version", std::string("ddprun (ddp) ") + kVersion,
                       "Print ddp's version and exit");
  app.footer(
      "Every flag also has an underscore spelling (--nproc_per_node) and a PET_ variable "
      "(PET_NPROC_PER_NODE) used when the flag is absent. See docs/ddprun.md.");

  std::map<std::string, ValueFlag> v;
  auto value_flag = [&](const std::string& key, const std::string& names,
                        const std::string& env_name, const std::string& help) {
    ValueFlag& f = v[key];
    f.names = names;
    f.env = env_name;
    f.help = help;
    f.option = app.add_option(names, f.cli_value,
                              env_name.empty() ? help : help + " [env " + env_name + "]")
                   ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  };
  std::map<std::string, BoolFlag> b;
  auto bool_flag = [&](const std::string& key, const std::string& names,
                       const std::string& env_name, const std::string& help) {
    BoolFlag& f = b[key];
    f.names = names;
    f.env = env_name;
    f.help = help;
    f.option = app.add_flag(names, f.cli_value, help + " [env " + env_name + "]");
  };

  value_flag(
      "nnodes", "--nnodes", "PET_NNODES",
      "Number of nodes: N, or MIN:MAX for an elastic job (c10d or etcd backend) (default 1)");
  value_flag("nproc", "--nproc-per-node,--nproc_per_node", "PET_NPROC_PER_NODE",
             "Workers on this node: N, auto, cpu or gpu (default 1)");
  value_flag("node_rank", "--node-rank,--node_rank", "PET_NODE_RANK",
             "Rank of this node with the static backend (default 0; c10d assigns ranks)");
  value_flag("master_addr", "--master-addr,--master_addr", "PET_MASTER_ADDR",
             "Address of rank 0's TCPStore (default 127.0.0.1)");
  value_flag("master_port", "--master-port,--master_port", "PET_MASTER_PORT",
             "Port of rank 0's TCPStore (default 29500)");
  bool_flag("standalone", "--standalone", "PET_STANDALONE",
            "One-node run: pick a free master port and a random run id");
  value_flag("max_restarts", "--max-restarts,--max_restarts", "PET_MAX_RESTARTS",
             "Restarts of the worker group after a failure (default 0)");
  value_flag("monitor_interval", "--monitor-interval,--monitor_interval", "PET_MONITOR_INTERVAL",
             "Accepted for torchrun compatibility; ddprun reacts to events at once (default 0.1)");
  value_flag("start_method", "--start-method,--start_method", "PET_START_METHOD",
             "Accepted for torchrun compatibility (spawn, fork, forkserver); ignored");
  value_flag("role", "--role", "PET_ROLE", "Role name of the workers (default 'default')");
  value_flag("run_id", "--run-id,--run_id,--rdzv-id,--rdzv_id", "PET_RDZV_ID",
             "Run id: TORCHELASTIC_RUN_ID and the log folder name (default 'none', random "
             "with --standalone)");
  value_flag("rdzv_backend", "--rdzv-backend,--rdzv_backend", "PET_RDZV_BACKEND",
             "Rendezvous backend: static (fixed --node-rank), c10d (elastic), or etcd / etcd-v2 "
             "(elastic, on an etcd cluster) (default static)");
  value_flag("rdzv_endpoint", "--rdzv-endpoint,--rdzv_endpoint", "PET_RDZV_ENDPOINT",
             "HOST[:PORT] of the rendezvous store, served by the agent on HOST (default port "
             "29400); etcd: HOST[:PORT][,HOST[:PORT]...], the etcd cluster's members (port 2379)");
  value_flag("rdzv_conf", "--rdzv-conf,--rdzv_conf", "PET_RDZV_CONF",
             "key=value,...: join_timeout, last_call_timeout, close_timeout, heartbeat, "
             "connect_timeout (seconds), token_file, standby_stores (c10d); etcd: protocol, "
             "cacert, cert, key, "
             "read_timeout, etcd_prefix, key_ttl");
  value_flag("local_addr", "--local-addr,--local_addr", "PET_LOCAL_ADDR",
             "Address of this node for the others (default: the source address of the route "
             "to the endpoint)");
  value_flag("log_dir", "--log-dir,--log_dir", "PET_LOG_DIR",
             "Write DIR/<run id>/attempt_<n>/<rank>/{stdout,stderr}.log");
  value_flag("redirects", "-r,--redirects", "PET_REDIRECTS",
             "Streams sent to log files only: 0 none, 1 stdout, 2 stderr, 3 both, or a map "
             "like 0:1,1:2 (default 0)");
  value_flag("tee", "-t,--tee", "PET_TEE",
             "Streams sent to log files and the console with a [role rank]: prefix (same "
             "syntax as --redirects)");
  value_flag("local_ranks_filter", "--local-ranks-filter,--local_ranks_filter",
             "PET_LOCAL_RANKS_FILTER", "Only these local ranks reach the console, e.g. 0 or 0,1");
  bool_flag("no_python", "--no-python,--no_python", "PET_NO_PYTHON",
            "Execute PROGRAM directly, even a .py file");
  bool_flag("module", "-m,--module", "PET_MODULE", "Run PROGRAM as a Python module (python -m)");
  bool_flag("run_path", "--run-path,--run_path", "PET_RUN_PATH",
            "Run PROGRAM in Python with runpy.run_path (takes precedence over --no-python and "
            "--module)");
  // torchrun reads no PET_ variable for these two.
  value_flag("numa_binding", "--numa-binding,--numa_binding", "",
             "Bind each worker to the CPUs near its GPU (or, without GPUs, a block of the NUMA "
             "nodes): node, socket, exclusive or core-complex");
  value_flag("logs_specs", "--logs-specs,--logs_specs", "",
             "torchrun's Python LogsSpecs plugin: not available in ddprun (an error)");
  bool_flag("virtual_local_rank", "--virtual-local-rank,--virtual_local_rank",
            "PET_VIRTUAL_LOCAL_RANK",
            "LOCAL_RANK=0 in every worker, and CUDA_VISIBLE_DEVICES naming only its GPU");
  value_flag("duplicate_stdout_filters", "--duplicate-stdout-filters,--duplicate_stdout_filters",
             "PET_DUPLICATE_STDOUT_FILTERS",
             "Comma-separated strings (',,' is a comma): tee'd stdout lines containing any also "
             "go to ROOT/attempt_<n>/filtered_stdout.log");
  value_flag("duplicate_stderr_filters", "--duplicate-stderr-filters,--duplicate_stderr_filters",
             "PET_DUPLICATE_STDERR_FILTERS",
             "The same for stderr lines: ROOT/attempt_<n>/filtered_stderr.log");
  value_flag("event_log_handler", "--event-log-handler,--event_log_handler",
             "PET_EVENT_LOG_HANDLER",
             "null or dynamic_rendezvous (nothing), or console: the final torchelastic event as a "
             "JSON line on stderr (default null)");
  value_flag("signals_to_handle", "--signals-to-handle,--signals_to_handle",
             "PET_SIGNALS_TO_HANDLE",
             "Comma-separated signals ddprun catches and forwards to every worker; SIGINT, "
             "SIGTERM, SIGHUP, SIGQUIT then stop the workers (grace, SIGKILL), SIGUSR1 and SIGUSR2 "
             "leave them running; signals not listed keep their default action (default "
             "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2)");
  value_flag("shutdown_timeout", "--shutdown-timeout,--shutdown_timeout", "PET_SHUTDOWN_TIMEOUT",
             "Seconds the workers get to exit after SIGTERM before SIGKILL (default: "
             "DDPRUN_TERM_GRACE_S, TORCH_ELASTIC_SHUTDOWN_TIMEOUT, or 30)");
  value_flag("recovery", "--recovery", "PET_RECOVERY",
             "After a worker fails: group (stop every worker, restart the group), step (restart "
             "only that worker; the others, on every node, drop the step in flight and go on; "
             "docs/recovery.md) or shrink (as step, and the others go on without it at once "
             "until it is back) (default group)");
  value_flag("warm_spare", "--warm-spare,--warm_spare", "PET_WARM_SPARE",
             "With --recovery step or shrink and a Python PROGRAM: auto keeps one interpreter per "
             "node that has imported torch and ddp, in which a restarted rank runs (it starts "
             "in a fraction of the time), or off (default auto)");
  value_flag("hang_timeout", "--hang-timeout,--hang_timeout", "PET_HANG_TIMEOUT",
             "End the job when no collective completed for this many seconds while one waited "
             "(PyTorch workers' flight recorder; docs/ddprun.md, 'My job is stuck') (default off)");

  // `ddprun doctor [--rdzv-endpoint HOST:PORT]`: checks instead of a launch.
  DoctorCommand doctor_command;
  CLI::App* doctor = app.add_subcommand(
      "doctor",
      "Check what makes multi-node runs hang or fail: cluster variables, network interface "
      "settings, GPUs, and (given an endpoint) name resolution, route, TCP connect, store "
      "authentication and clock skew. Exit 1 when a check fails.");
  doctor->add_option("--rdzv-endpoint,--rdzv_endpoint,--endpoint", doctor_command.endpoint,
                     "HOST[:PORT] of the rendezvous or master store to check (default: "
                     "MASTER_ADDR:MASTER_PORT when set)");
  doctor->add_option("--timeout", doctor_command.timeout_s,
                     "Seconds allowed for each network step (default 3)");
  doctor->add_option("--token-file", doctor_command.token_file,
                     "File holding the store token (default: DDP_STORE_TOKEN)");
  doctor->add_option("--rdzv-backend,--rdzv_backend", doctor_command.backend,
                     "etcd or etcd-v2: check the etcd cluster's members listed in "
                     "--rdzv-endpoint (version, leader, a timed write) instead of a ddp store");
  doctor->add_option("--rdzv-conf,--rdzv_conf", doctor_command.rdzv_conf,
                     "The job's --rdzv-conf: with etcd its TLS keys (protocol, cacert, cert, key) "
                     "and etcd_prefix; token_file for a ddp store");

  // `ddprun trace FILES...`: the hang report from flight recorder dumps.
  TraceCommand trace_command;
  CLI::App* trace = app.add_subcommand(
      "trace",
      "Read the flight recorder dumps the workers wrote when a collective timed out or failed "
      "(flight_recorder.*.json, in the run's attempt folder or DDP_FLIGHT_RECORDER_DIR) and "
      "print a hang report: which rank is behind, which called a different collective, which "
      "died.");
  trace->add_option("paths", trace_command.paths, "Dump files, or directories to search")
      ->required();

  // `ddprun stacks --run-id ID`: the running workers' stacks on every node.
  StacksCommand stacks_command;
  CLI::App* stacks = app.add_subcommand(
      "stacks",
      "Print every worker's current stack (py-spy for Python, eu-stack for native workers) on "
      "every node of a running job, identical stacks folded, the odd ones first.");
  stacks->add_option("--run-id,--run_id,--rdzv-id,--rdzv_id", stacks_command.run_id,
                     "The job's --run-id / --rdzv-id");
  stacks->add_option("--log-dir,--log_dir", stacks_command.log_dir,
                     "The job's --log-dir (or its run folder DIR/<run id>)");
  stacks->add_option("--timeout", stacks_command.timeout_s,
                     "Seconds to wait for every node's answer (default 10)");
  stacks->add_flag("--json", stacks_command.json, "Print the stacks as JSON");

  std::vector<std::string> argv_storage = {"ddprun"};
  argv_storage.insert(argv_storage.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_storage) argv.push_back(a.data());
  try {
    app.parse(static_cast<int>(argv.size()), argv.data());
  } catch (const CLI::CallForHelp&) {
    ParsedCommandLine result;
    result.help =
        doctor->parsed()
            ? doctor->help()
            : (trace->parsed() ? trace->help() : (stacks->parsed() ? stacks->help() : app.help()));
    return result;
  } catch (const CLI::CallForVersion& e) {
    ParsedCommandLine result;
    result.help = std::string(e.what()) + "\n";
    return result;
  } catch (const CLI::ParseError& e) {
    throw UsageError(fmt::format("{}; run 'ddprun --help' for the list of flags", e.what()));
  }

  if (stacks->parsed()) {
    if (stacks_command.run_id.empty() && !stacks_command.log_dir) {
      throw UsageError(
          "ddprun stacks: which job? pass --run-id ID (the job's --run-id / --rdzv-id) or "
          "--log-dir DIR (the job's --log-dir, with --run-id, or its run folder)");
    }
    if (!(stacks_command.timeout_s > 0)) {
      throw UsageError("ddprun stacks --timeout: expected a positive number of seconds");
    }
    ParsedCommandLine result;
    result.stacks = stacks_command;
    return result;
  }
  if (trace->parsed()) {
    ParsedCommandLine result;
    result.trace = trace_command;
    return result;
  }
  if (doctor->parsed()) {
    if (!(doctor_command.timeout_s > 0)) {
      throw UsageError("ddprun doctor --timeout: expected a positive number of seconds");
    }
    ParsedCommandLine result;
    result.doctor = doctor_command;
    return result;
  }

  std::vector<std::string> rest = app.remaining();
  bool after_double_dash = !rest.empty() && rest.front() == "--";
  if (after_double_dash) rest.erase(rest.begin());
  if (rest.empty()) {
    throw UsageError("no PROGRAM given; usage: ddprun [flags] PROGRAM [ARGS...]");
  }
  if (!after_double_dash && rest.front().size() > 1 && rest.front()[0] == '-') {
    std::string flag = rest.front().substr(0, rest.front().find('='));
    std::string best;
    size_t best_distance = 4;
    for (auto* opt : app.get_options()) {
      for (const auto& name : opt->get_lnames()) {
        size_t d = edit_distance(flag, "--" + name);
        if (d < best_distance) {
          best_distance = d;
          best = "--" + name;
        }
      }
    }
    throw UsageError(
        fmt::format("unknown flag '{}'{}; flags go before PROGRAM, run 'ddprun "
                    "--help' for the list (put '--' before a PROGRAM whose name "
                    "starts with '-')",
                    flag, best.empty() ? "" : fmt::format(" (did you mean '{}'?)", best)));
  }

  LaunchOptions o;
  o.program = rest.front();
  o.program_args.assign(rest.begin() + 1, rest.end());

  if (auto s = value_of(v["rdzv_backend"], env)) {
    try {
      o.rdzv_backend = rdzv::to_string(rdzv::parse_backend(s->value));
    } catch (const UsageError&) {
      throw UsageError(fmt::format(
          "{} {}: unknown rendezvous backend; use c10d (elastic, node ranks in join order), "
          "etcd or etcd-v2 (elastic, on an etcd cluster) or static (fixed --node-rank)",
          s->source, s->value));
    }
    o.given.rdzv_backend = true;
  }
  if (auto s = value_of(v["rdzv_endpoint"], env)) {
    rdzv::parse_endpoints(s->value, rdzv::kDefaultRendezvousPort);  // validates
    o.rdzv_endpoint = s->value;
  }
  if (auto s = value_of(v["rdzv_conf"], env)) {
    rdzv::parse_rdzv_conf(s->value);  // validates
    o.rdzv_conf = s->value;
  }
  if (auto s = value_of(v["local_addr"], env)) {
    if (s->value.empty()) throw UsageError(fmt::format("{}: empty address", s->source));
    o.local_addr = s->value;
  }
  if (auto s = value_of(v["start_method"], env)) {
    if (s->value != "spawn" && s->value != "fork" && s->value != "forkserver") {
      throw UsageError(
          fmt::format("{}: '{}' is not one of spawn, fork, forkserver", s->source, s->value));
    }
  }
  if (auto s = value_of(v["nnodes"], env)) {
    rdzv::NodeRange range = parse_nnodes(*s);
    o.nnodes_min = range.min;
    o.nnodes = range.max;
    o.given.nnodes = true;
    if (range.min != range.max && !rdzv::is_elastic(rdzv::parse_backend(o.rdzv_backend))) {
      throw UsageError(fmt::format(
          "{} {}: an elastic node range needs --rdzv-backend c10d or etcd (and --rdzv-endpoint); "
          "the static backend needs a fixed count",
          s->source, s->value));
    }
  }
  if (auto s = value_of(v["nproc"], env)) {
    o.nproc_per_node = resolve_nproc_per_node(s->value, s->source, env);
    o.given.nproc_per_node = true;
  }
  if (auto s = value_of(v["node_rank"], env)) {
    o.given.node_rank = true;
    o.node_rank = parse_int(*s, 0, 1 << 20, "a node rank (0 or more)");
    if (o.node_rank >= o.nnodes) {
      throw UsageError(fmt::format(
          "{} {} is outside [0, {}) for --nnodes {}; give each node a distinct --node-rank "
          "from 0 to {}",
          s->source, o.node_rank, o.nnodes, o.nnodes, o.nnodes - 1));
    }
  }
  if (auto s = value_of(v["master_addr"], env)) {
    if (s->value.empty()) throw UsageError(fmt::format("{}: empty address", s->source));
    o.master_addr = s->value;
    o.given.master_addr = true;
  }
  if (auto s = value_of(v["master_port"], env)) {
    o.master_port = parse_int(*s, 1, 65535, "a TCP port (1-65535)");
    o.given.master_port = true;
  }
  o.standalone = bool_of(b["standalone"], env);
  if (auto s = value_of(v["max_restarts"], env)) {
    o.max_restarts = parse_int(*s, 0, 1 << 20, "a restart count (0 or more)");
  }
  if (auto s = value_of(v["monitor_interval"], env)) {
    o.monitor_interval_s = parse_positive_double(*s);
  }
  if (auto s = value_of(v["role"], env)) {
    if (s->value.empty()) throw UsageError(fmt::format("{}: the role name is empty", s->source));
    o.role = s->value;
  }
  if (auto s = value_of(v["run_id"], env)) {
    if (s->value.find('/') != std::string::npos || s->value == "." || s->value == "..") {
      throw UsageError(fmt::format(
          "{}: '{}' cannot name a log folder; use letters, digits, '-', '_'", s->source, s->value));
    }
    o.run_id = s->value;
    o.given.run_id = true;
  } else if (o.standalone) {
    o.run_id = random_run_id();
  }
  if (auto s = value_of(v["log_dir"], env)) o.log_dir = s->value;
  if (auto s = value_of(v["redirects"], env)) o.redirects = parse_std_spec(s->value, s->source);
  if (auto s = value_of(v["tee"], env)) o.tee = parse_std_spec(s->value, s->source);
  if (auto s = value_of(v["local_ranks_filter"], env)) o.local_ranks_filter = parse_rank_list(*s);
  o.no_python = bool_of(b["no_python"], env);
  o.module = bool_of(b["module"], env);
  o.run_path = bool_of(b["run_path"], env);
  if (o.module && o.no_python && !o.run_path) {
    throw UsageError(
        "--module and --no-python cannot be used together: -m runs 'python -m "
        "MODULE', --no-python runs PROGRAM without Python; drop one");
  }

  if (auto s = value_of(v["numa_binding"], env)) {
    o.placement.numa_binding = parse_numa_binding(s->value);
    if (!o.placement.numa_binding) {
      throw UsageError(fmt::format(
          "{} {}: expected node, socket, exclusive or core-complex (torch.numa's modes)", s->source,
          s->value));
    }
  }
  o.placement.virtual_local_rank = bool_of(b["virtual_local_rank"], env);
  if (auto s = value_of(v["logs_specs"], env)) {
    throw UsageError(fmt::format(
        "{} {}: ddprun cannot load torchrun's Python LogsSpecs plugins (entry points "
        "'torchrun.logs_specs'); ddprun's logs are laid out by --log-dir, --redirects, --tee and "
        "--local-ranks-filter (docs/ddprun.md): drop --logs-specs, or launch with torchrun",
        s->source, s->value));
  }
  if (auto s = value_of(v["duplicate_stdout_filters"], env)) {
    o.duplicate_stdout_filters = split_filters(s->value);
  }
  if (auto s = value_of(v["duplicate_stderr_filters"], env)) {
    o.duplicate_stderr_filters = split_filters(s->value);
  }
  if (auto s = value_of(v["event_log_handler"], env)) {
    if (s->value != "null" && s->value != "console" && s->value != "dynamic_rendezvous") {
      throw UsageError(
          fmt::format("{} {}: unknown event log handler; torchrun's are null, console and "
                      "dynamic_rendezvous",
                      s->source, s->value));
    }
    o.event_log_handler = s->value;
  }

  if (auto s = value_of(v["hang_timeout"], env)) {
    o.hang_timeout =
        std::chrono::milliseconds(static_cast<int64_t>(parse_positive_double(*s) * 1000));
  }
  if (auto limit = env_seconds(env, "DDPRUN_STACKS_TIMEOUT_S", Seconds::kZeroOrMore)) {
    o.stacks_limit = *limit;
  }
  if (auto grace = env_seconds(env, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT", Seconds::kZeroOrMore)) {
    o.term_grace = *grace;
  }
  if (auto grace = env_seconds(env, "DDPRUN_TERM_GRACE_S", Seconds::kZeroOrMore)) {
    o.term_grace = *grace;
  }
  if (auto s = value_of(v["shutdown_timeout"], env)) {
    char* end = nullptr;
    const double seconds = std::strtod(s->value.c_str(), &end);
    if (end == s->value.c_str() || *end != '\0' || !(seconds >= 0)) {
      throw UsageError(
          fmt::format("{} {}: expected seconds (0 or more, e.g. 30 or 0.5)", s->source, s->value));
    }
    o.term_grace = std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000));
  }
  if (auto s = value_of(v["signals_to_handle"], env)) {
    o.signals_to_handle = parse_signal_list(s->value, s->source);
  }
  o.rdzv_progress_interval = env_seconds(env, "DDPRUN_RDZV_PROGRESS_S", Seconds::kPositive);
  if (auto s = value_of(v["recovery"], env)) {
    const RecoveryMode mode = parse_recovery_mode(s->value, s->source);
    o.recovery_step = mode != RecoveryMode::kGroup;
    o.recovery_shrink = mode == RecoveryMode::kShrink;
  }
  if (auto s = value_of(v["warm_spare"], env)) {
    if (s->value != "auto" && s->value != "off") {
      throw UsageError(fmt::format("{} {}: expected auto or off", s->source, s->value));
    }
    o.warm_spare = s->value == "auto";
  }

  ParsedCommandLine result;
  result.options = std::move(o);
  return result;
}

}  // namespace ddp::launcher
