#!/usr/bin/env bash
# The whole test suite: installs what is missing, builds everything, runs ctest, then the
# sanitizer stage (scripts/sanitizer-tests.sh: ASan+UBSan and TSan trees, label "sanitize").
# DDP_SANITIZERS=0 skips that stage; a failure in either stage fails the script.
#
# The sanitizer trees are built in the background, at the lowest CPU priority (nice 19), from
# the moment the Debian packages are there: while pip fills the virtual environment (one core),
# the main build and the main ctest run, they take only the CPU those leave idle. Their tests
# run after the main run, the two trees' side by side, in the order they were added but for the
# asan tree's rendezvous scripts, which start first (tests/sanitizers/asan_ctest_costs.txt).
# Started longest first, both trees' heaviest tests ran at once and load-sensitive ones failed
# (a TSan TcpRing test past its 120 s timeout, an ASan stack-service test; 2026-11-29).
#
# Each stage prints its duration ("=== test.sh: <stage> took N s"), so a change that makes one
# slower shows in every run (README: "How long the tests take").
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir="${DDP_BUILD_DIR:-build}"
started=$SECONDS
# The machine's busy CPU time so far, in seconds (/proc/stat: every core's user, nice, system,
# irq and softirq time): each stage prints how much of the cores it kept busy, which says
# whether a slow stage needs less work or more overlap (issue 47).
busy_cpu_s() { awk -v hz="$(getconf CLK_TCK)" '/^cpu /{print int(($2 + $3 + $4 + $7 + $8) / hz)}' /proc/stat; }
stage_cpu_start=$(busy_cpu_s)
took() {
  local busy now=$(busy_cpu_s) wall=$((SECONDS - $2))
  busy=$((now - stage_cpu_start))
  stage_cpu_start=$now
  echo "=== test.sh: $1 took $wall s (total $((SECONDS - started)) s; the cores busy for $busy s of $((wall * $(nproc))) s)"
}

t=$SECONDS
scripts/install-deps.sh test system
took "install-deps (Debian packages)" "$t"

# A cold ccache (a fresh machine) and a fresh tree: only objects that another build of this run
# compiles again go through ccache (CMakeLists.txt: DDP_CCACHE): in the main tree the libraries,
# which pip's builds in the package tests take back; in the sanitizer trees none. Caching the
# rest would cost CPU and save nothing. A warm cache keeps every target cached, as before.
main_ccache=()
if [[ "$(ccache --print-stats 2>/dev/null | awk '$1 == "files_in_cache" {print $2}')" == 0 ]]; then
  [[ -f "$build_dir/CMakeCache.txt" ]] || main_ccache=(-DDDP_CCACHE=libraries)
  export DDP_SANITIZER_CCACHE=off
fi

# The sanitizer trees need no Python: they build from here on, at the lowest CPU priority, on
# the core pip leaves idle (it runs on one) and on what the build and the main ctest run leave.
status=0
sanitizer_build_pid=""
sanitizer_log="$build_dir/sanitizer-build.log"
if [[ "${DDP_SANITIZERS:-1}" != 0 ]]; then
  mkdir -p "$build_dir"
  echo "=== sanitizer stage: building the asan and tsan trees in the background ($sanitizer_log)"
  # The interpreter the trees' Python-using tests run: the one the next step makes.
  DDP_PYTHON="${DDP_VENV:-$PWD/.venv}/bin/python" DDP_SANITIZER_PHASE=build \
    nice -n 19 scripts/sanitizer-tests.sh >"$sanitizer_log" 2>&1 &
  sanitizer_build_pid=$!
  # A step below that fails ends this script (set -e): the build must not outlive it.
  trap '[[ -n "$sanitizer_build_pid" ]] && kill -- "$sanitizer_build_pid" 2>/dev/null; true' EXIT
fi

t=$SECONDS
scripts/install-deps.sh test python
took "install-deps (Python environment)" "$t"

t=$SECONDS
scripts/build.sh -DDDP_BUILD_TESTS=ON "${main_ccache[@]}"
took "build" "$t"
# Tests that compile (the package tests' consumer builds) use the main tree's compiler, which
# scripts/build.sh chose; the pip builds in them pick it from the tree themselves, for ccache.
# The sanitizer trees, started above, keep the system's c++.
CC="$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' "$build_dir/CMakeCache.txt")"
CXX="$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build_dir/CMakeCache.txt")"
export CC CXX
echo "=== main stage: compiled with $CXX"

# ctest runs up to DDP_TEST_JOBS tests at once (default: twice the cores); a test that keeps a
# core busy for long says so with PROCESSORS 2 (tests/CMakeLists.txt, "Scheduling"), so the
# tests running at once do not ask for much more CPU than the machine has.
#
# A fresh tree has no cost data yet: ctest would start the tests in the order they were added,
# the longest among the last. tests/ctest_costs.txt seeds it; ctest keeps it up to date.
costs="$build_dir/Testing/Temporary/CTestCostData.txt"
if [[ ! -s "$costs" ]]; then
  mkdir -p "$(dirname "$costs")"
  grep -v '^#' tests/ctest_costs.txt >"$costs"
fi
t=$SECONDS
jobs="${DDP_TEST_JOBS:-$((2 * $(nproc)))}"
echo "=== main stage: ctest -j $jobs ($build_dir)"
(cd "$build_dir" && ctest --output-on-failure --timeout 900 -j "$jobs") || status=1
took "main stage (ctest)" "$t"

if [[ -n "$sanitizer_build_pid" ]]; then
  t=$SECONDS
  build_ok=0
  wait "$sanitizer_build_pid" || build_ok=$?
  sanitizer_build_pid=""
  if ((build_ok == 0)); then
    grep '^=== sanitizer stage' "$sanitizer_log" || true
    took "waiting for the sanitizer trees' build" "$t"
    # The two trees' tests run side by side (they mostly wait on processes and sockets: the
    # asan run alone kept the 2 cores about a third busy), each into its own log, printed after.
    t=$SECONDS
    pids=()
    for stage in asan tsan; do
      DDP_SANITIZER_PHASE=test scripts/sanitizer-tests.sh "$stage" >"$build_dir/sanitizer-$stage.log" 2>&1 &
      pids+=($!)
    done
    for i in 0 1; do
      stage=$([[ $i == 0 ]] && echo asan || echo tsan)
      if wait "${pids[$i]}"; then
        grep '^=== sanitizer stage' "$build_dir/sanitizer-$stage.log" || true
      else
        cat "$build_dir/sanitizer-$stage.log" >&2
        status=1
      fi
    done
    took "sanitizer stage (tests)" "$t"
  else
    tail -n 60 "$sanitizer_log" >&2
    echo "=== sanitizer stage: building the trees FAILED (whole log: $sanitizer_log)" >&2
    status=1
  fi
fi

((status == 0)) && echo "=== test.sh: all stages passed in $((SECONDS - started)) s" ||
  echo "=== test.sh: FAILED after $((SECONDS - started)) s" >&2
exit $status
