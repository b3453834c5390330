#!/usr/bin/env bash
# Configures and builds ddp in Release into ${DDP_BUILD_DIR:-build}. Extra args go to cmake's
# configure step. DDP_TARGETS (space-separated) builds only those targets and what they need;
# unset builds everything (the tests and benchmarks included).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${DDP_BUILD_DIR:-build}"
jobs="${DDP_JOBS:-$(nproc)}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
targets=()
for t in ${DDP_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
