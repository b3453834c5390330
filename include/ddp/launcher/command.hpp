#pragma once
// Turns PROGRAM [ARGS...] into the argv each worker execs, like torchrun: a Python script
// (PROGRAM ends in .py) runs as `PYTHON -u PROGRAM ARGS`, -m runs `PYTHON -u -m MODULE ARGS`,
// --no-python and any other program exec PROGRAM directly. PYTHON is $DDPRUN_PYTHON, else
// the first python3 on PATH (an activated virtual environment's, as a shell would run). argv[0] is
// resolved to a path here (in the launcher) so a missing program is a UsageError before any worker
// starts.

#include <string>
#include <vector>

#include "ddp/launcher/cli.hpp"
#include "ddp/launcher/launch_options.hpp"

namespace ddp::launcher {

std::vector<std::string> worker_command(const LaunchOptions& options, const EnvLookup& env);

// Finds `name` like execvp: a name with a '/' is taken as is, otherwise PATH is searched
// for an executable file. Throws UsageError naming the program when none is found.
std::string resolve_executable(const std::string& name, const EnvLookup& env);

}  // namespace ddp::launcher
