#!/usr/bin/env bash
# Configures and builds ddp in Release into ${DDP_BUILD_DIR:-build}. Extra args go to cmake's
# configure step. DDP_TARGETS (space-separated) builds only those targets and what they need;
# unset builds everything (the tests and benchmarks included).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${DDP_BUILD_DIR:-build}"
jobs="${DDP_JOBS:-$(nproc)}"
# A fresh tree compiles with clang where it is installed (scripts/install-deps.sh's test profile
# installs it) and CC/CXX name no compiler; else with the system's c++ (GCC). clang's
# precompiled LibTorch header carries the template instantiations LibTorch's inline functions
# need (CMake gives it -fpch-instantiate-templates); GCC instantiates them again in every
# translation unit that uses its header, about 5 s of CPU each even for an empty one. The whole
# build with tests took ~920 CPU-s with clang 14 and ~1,260 with GCC 12 (issue 47). An existing
# tree keeps the compiler it was configured with.
if [[ ! -f "$build_dir/CMakeCache.txt" && -z "${CC:-}${CXX:-}" ]] && command -v clang++ >/dev/null &&
  command -v clang >/dev/null; then
  export CC=clang CXX=clang++
fi
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" >/dev/null
targets=()
for t in ${DDP_TARGETS:-}; do targets+=(--target "$t"); done
cmake --build "$build_dir" -j "$jobs" "${targets[@]}"
