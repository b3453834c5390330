#pragma once
// `ddprun stacks --run-id ID [--log-dir DIR] [--timeout S] [--json]`: finds this host's agent
// of the running job (its record in the registry folder, or in the job's log folder: see
// stack_service.hpp), asks it over its Unix socket for every node's worker stacks, and prints
// them folded (stacks.hpp), the odd ones first.
//
// Exit status: 0 when every node answered and every rank's stack was read; 1 when some rank or
// node is missing (the stacks found are printed, then what is missing and why); 2 when no agent
// of the job runs on this host (the message says where it looked and what to pass).

#include "ddp/launcher/cli.hpp"

namespace ddp::launcher {

int run_stacks_command(const StacksCommand& command);

}  // namespace ddp::launcher
