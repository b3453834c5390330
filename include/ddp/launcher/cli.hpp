#pragma once
// ddprun's command line: torchrun's flags in both spellings (--nproc-per-node and
// --nproc_per_node) with PET_* environment fallbacks (PET_NPROC_PER_NODE, ...), then
// PROGRAM [ARGS...], which are passed to every worker untouched.
//
// Contract: bad input throws ddp::UsageError whose message names the flag, the value and the
// fix; the caller prints it and exits 2. Nothing here prints or exits.

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "ddp/launcher/launch_options.hpp"

namespace ddp::launcher {

// Reads an environment variable; nullopt when unset. Injected so tests need not touch the
// process environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;

// The process environment.
EnvLookup process_env();

// `ddprun doctor [--rdzv-endpoint HOST:PORT] [--timeout S] [--token-file FILE]`, or with
// `--rdzv-backend etcd|etcd-v2 --rdzv-endpoint HOST:PORT,... [--rdzv-conf protocol=,cacert=,
// cert=,key=,etcd_prefix=]`: the etcd cluster's members instead of a ddp store.
struct DoctorCommand {
  std::optional<std::string> endpoint;
  double timeout_s = 3.0;
  std::optional<std::string> token_file;
  std::optional<std::string> backend;
  std::optional<std::string> rdzv_conf;
};

// `ddprun trace FILES...`: flight recorder dumps (or directories holding them) to analyse.
struct TraceCommand {
  std::vector<std::string> paths;
};

// `ddprun stacks --run-id ID [--log-dir DIR] [--timeout S] [--json]`: every worker's stack of
// a running job (stacks_command.hpp).
struct StacksCommand {
  std::string run_id;                  // "" : --log-dir must name the run's folder
  std::optional<std::string> log_dir;  // the job's --log-dir (or its run folder)
  double timeout_s = 10.0;
  bool json = false;
};

struct ParsedCommandLine {
  // Set for a launch (unless --help or --version was asked for).
  std::optional<LaunchOptions> options;
  // Set for `ddprun doctor`.
  std::optional<DoctorCommand> doctor;
  // Set for `ddprun trace`.
  std::optional<TraceCommand> trace;
  // Set for `ddprun stacks`.
  std::optional<StacksCommand> stacks;
  // The text to print before exiting 0: the help for --help, the version for --version.
  std::string help;
};

// args excludes argv[0].
ParsedCommandLine parse_command_line(const std::vector<std::string>& args, const EnvLookup& env);

// N|auto|cpu|gpu -> a worker count. `flag` names the source in errors. GPUs are the NVIDIA
// device nodes in `dev_dir` (nvidia0, nvidia1, ...) that CUDA_VISIBLE_DEVICES (read through
// `env`) leaves visible, counted by visible_gpu_count. gpu with none visible is a UsageError;
// auto then means one worker per CPU, like torchrun.
int resolve_nproc_per_node(const std::string& value, const std::string& flag,
                           const EnvLookup& env = process_env(),
                           const std::string& dev_dir = "/dev");

// How many of `device_nodes` GPUs CUDA shows a process given CUDA_VISIBLE_DEVICES (nullopt:
// unset), as torch.cuda.device_count() counts them: comma-separated entries, each stripped;
// ordinals are read like strtoul ("1gpu" is 1) and the list ends at a negative or unreadable
// entry or at the first ordinal the node lacks; UUIDs ("GPU-...") and MIG names ("MIG-...")
// count as entries up to the first without that prefix; a repeated entry hides every GPU;
// empty or "-1" hides every GPU.
int visible_gpu_count(int device_nodes, const std::optional<std::string>& cuda_visible_devices);

}  // namespace ddp::launcher
