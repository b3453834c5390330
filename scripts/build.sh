#!/usr/bin/env bash
# Configures and builds ddp in Release into ${DDP_BUILD_DIR:-build}. Extra args go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${DDP_BUILD_DIR:-build}"
jobs="${DDP_JOBS:-$(nproc)}"
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
cmake --build "$build_dir" -j "$jobs"
