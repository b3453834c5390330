#!/usr/bin/env bash
# The sanitizer stage of the test suite (scripts/test.sh runs it after the main ctest run):
#   asan  the store, launcher, comm (cpu, gloo, mpi) and rendezvous tests, ASan+UBSan (build-asan)
#   tsan  the comm and store tests built with TSan (build-tsan)
# Each tree is LibTorch-free and builds only the targets its tests need; ctest --preset
# selects the tests labelled "sanitize" and sets the sanitizer options (CMakePresets.json,
# suppressions in tests/sanitizers/). Usage: sanitizer-tests.sh [asan] [tsan] (default both).
# Any sanitizer report fails the test that printed it, and the script exits non-zero.
# DDP_SANITIZER_PHASE=build only builds the trees, =test only runs their tests (scripts/test.sh
# builds them in the background, at the lowest CPU priority, while the main ctest run waits on
# processes and sockets); unset does both.
# ctest runs DDP_SANITIZER_TEST_JOBS tests at once, by default three times the cores for asan
# and twice for tsan: their tests mostly wait on processes and sockets. scripts/test.sh runs the
# two trees side by side; on 2 cores they took 276 s at -j4 and -j2 (the cores busy 63% of the
# time), 200 s at -j6 and -j4 (97%; 2026-11-29, issue 47).
set -euo pipefail
cd "$(dirname "$0")/.."

jobs="${DDP_JOBS:-$(nproc)}"
stages=("$@")
((${#stages[@]})) || stages=(asan tsan)

# Every test executable of the asan folders must be here: one left out shows in ctest as
# <name>_NOT_BUILT, "Not Run", a failure.
targets_asan=(store_tests launcher_unit_test launcher_e2e_test launcher_test_worker ddprun
              launcher_stacks_test comm_tests comm_worker comm_multiprocess_tests comm_mpi_worker
              comm_mpi_plugin_worker
              recoverable_group_tests rdzv_tests etcd_tests flight_recorder_tests
              flight_recorder_e2e_tests hang_worker launcher_parse_dump)
# TSan skips the flight recorder's ddprun runs (process-level concurrency, like the launcher
# tests: the tsan test preset excludes them), so it needs neither ddprun nor hang_worker.
targets_tsan=(comm_tests comm_worker comm_multiprocess_tests recoverable_group_tests store_tests
              flight_recorder_tests)

phase="${DDP_SANITIZER_PHASE:-all}"
case "$phase" in
  all | build | test) ;;
  *) echo "sanitizer-tests: DDP_SANITIZER_PHASE=$phase: expected build, test or unset" >&2; exit 2 ;;
esac

status=0
for stage in "${stages[@]}"; do
  case "$stage" in
    asan) targets=("${targets_asan[@]}") ;;
    tsan) targets=("${targets_tsan[@]}") ;;
    *) echo "sanitizer-tests: unknown stage '$stage' (expected asan or tsan)" >&2; exit 2 ;;
  esac
  if [[ "$phase" != test ]]; then
    start=$SECONDS
    echo "=== sanitizer stage: $stage: building ${targets[*]} (build-$stage)"
    # DDP_PYTHON: the interpreter the trees' Python-using tests run (scripts/test.sh names the
    # virtual environment it is still making); else the build's default (cmake/Dependencies.cmake).
    configure_args=()
    [[ -n "${DDP_PYTHON:-}" ]] && configure_args+=("-DDDP_PYTHON=$DDP_PYTHON")
    # DDP_SANITIZER_CCACHE: the tree's DDP_CCACHE (CMakeLists.txt), set only on a fresh tree
    # (changing it later would recompile everything); scripts/test.sh says off on a cold cache.
    [[ -n "${DDP_SANITIZER_CCACHE:-}" && ! -f "build-$stage/CMakeCache.txt" ]] &&
      configure_args+=("-DDDP_CCACHE=$DDP_SANITIZER_CCACHE")
    cmake --preset "$stage" "${configure_args[@]}" >/dev/null
    build_args=()
    for t in "${targets[@]}"; do build_args+=(--target "$t"); done
    cmake --build --preset "$stage" -j "$jobs" "${build_args[@]}"
    echo "=== sanitizer stage: $stage: built in $((SECONDS - start)) s"
  fi
  [[ "$phase" == build ]] && continue
  start=$SECONDS
  # A fresh tree's first run: the seeded tests start first (tests/sanitizers/<stage>_ctest_costs.txt).
  seed="tests/sanitizers/${stage}_ctest_costs.txt"
  costs="build-$stage/Testing/Temporary/CTestCostData.txt"
  if [[ -f "$seed" && ! -s "$costs" ]]; then
    mkdir -p "$(dirname "$costs")"
    grep -v '^#' "$seed" >"$costs"
  fi
  echo "=== sanitizer stage: $stage: ctest --preset $stage (label sanitize)"
  test_jobs=$((2 * $(nproc)))
  [[ $stage == asan ]] && test_jobs=$((3 * $(nproc)))
  if ctest --preset "$stage" -j "${DDP_SANITIZER_TEST_JOBS:-$test_jobs}"; then
    echo "=== sanitizer stage: $stage: passed in $((SECONDS - start)) s"
  else
    echo "=== sanitizer stage: $stage: FAILED" >&2
    status=1
  fi
done
exit $status
