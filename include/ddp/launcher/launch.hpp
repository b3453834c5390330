#pragma once
// From parsed options to a finished run: resolves the worker command, picks ports and run
// id, prints torchrun's OMP_NUM_THREADS note, and runs the agent. Returns ddprun's exit code
// (0 success, 1 workers failed, 128+signo interrupted). Throws ddp::UsageError for bad input
// found only now (missing program, unusable log dir).

#include "ddp/launcher/cli.hpp"
#include "ddp/launcher/launch_options.hpp"

namespace ddp::launcher {

int launch(const LaunchOptions& options, const EnvLookup& env);

}  // namespace ddp::launcher
