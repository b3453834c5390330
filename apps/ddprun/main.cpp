// ddprun [flags] PROGRAM [ARGS...]: starts PROGRAM once per worker with torchrun's
// environment, forwards output and signals, restarts the group on failure; with --nnodes
// and --rdzv-* it meets the other nodes first (docs/rendezvous.md).
// ddprun doctor [--rdzv-endpoint HOST:PORT]: checks the cluster and network setup.
// ddprun trace FILES...: the hang report from the workers' flight recorder dumps.
// ddprun stacks --run-id ID: every worker's current stack on every node of a running job.
//
// Exit codes: 0 every worker succeeded; 1 a worker failed and restarts are exhausted (or the
// launcher itself failed); 2 bad command line; 75 the workers checkpointed on request and ask
// to be requeued (ddp::kRequeueExitStatus); 128+N stopped by signal N.

#include <cstdio>
#include <string>
#include <vector>

#include "ddp/launcher/cli.hpp"
#include "ddp/launcher/hang_report.hpp"
#include "ddp/launcher/launch.hpp"
#include "ddp/launcher/multi_node.hpp"
#include "ddp/launcher/stack_tracer.hpp"
#include "ddp/launcher/stacks_command.hpp"
#include "ddp/util/error.hpp"

int main(int argc, char** argv) {
  using namespace ddp::launcher;
  std::vector<std::string> args(argv + 1, argv + argc);
  // The agent's stack tracer (stack_tracer.hpp): started by ddprun itself, not a user command.
  if (!args.empty() && args[0] == StackTracer::kCommand) {
    return run_stack_tracer_process({args.begin() + 1, args.end()});
  }
  EnvLookup env = process_env();
  try {
    ParsedCommandLine parsed = parse_command_line(args, env);
    if (parsed.doctor) return run_doctor_command(*parsed.doctor);
    if (parsed.trace) return run_trace_command(parsed.trace->paths);
    if (parsed.stacks) return run_stacks_command(*parsed.stacks);
    if (!parsed.options) {
      std::fputs(parsed.help.c_str(), stdout);
      return 0;
    }
    return launch(*parsed.options, env);
  } catch (const ddp::UsageError& e) {
    std::fprintf(stderr, "ddprun: error: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ddprun: error: %s\n", e.what());
    return 1;
  }
}
