#!/usr/bin/env bash
# PyTorch's own distributed test suite (torch.testing._internal.distributed.distributed_test, in
# the torch wheel) on gloo and on ddp, world size 2: every test that passes on gloo must pass on
# ddp or be a known gap (tests/python/torch_suite_known_gaps.txt, with its reason).
#
#   tests/python/torch_suite.sh [BUILD_DIR] [-k PATTERN]... [--backends gloo,ddp] [--jobs N]
#                               [--out DIR] [--require-pass] [--no-ungated] [--lift-skips LIST]
#
#   BUILD_DIR        the build tree with python/ddp (default: <repo>/build)
#   -k PATTERN       run only the tests it selects (repeatable; see torch_suite_driver.py:
#                    shell-style pattern, a plain word matches names containing it, =NAME exactly)
#   --backends LIST  comma-separated (default gloo,ddp); with one backend nothing is compared
#   --jobs N         run each backend's tests in N shards at once (default 1; the machine's
#                    cores are shared by N x WORLD_SIZE ranks, timing-sensitive tests may suffer)
#   --out DIR        where results.jsonl and the logs go (default BUILD_DIR/torch_suite)
#   --require-pass   every selected test must pass on every backend run (the ctest subset)
#   --no-ungated     skip the diagnostic pass below
#   --lift-skips LIST  comma-separated test names to run without the suite's import-time skips
#                    (for tests the suite runs on gloo only; the ctest subset uses it)
#
# The suite skips some tests for every backend but gloo by name ("Only gloo backend supports
# timeouts"). After gloo and ddp, the tests that passed on gloo and were skipped on ddp run once
# more on ddp with those skips removed ("ddp-ungated" in the results, 60 s per test): it shows
# which of them ddp passes. It only informs; the exit status does not depend on it.
#
# Environment: DDP_PYTHON (default <repo>/.venv/bin/python), TORCH_SUITE_TEST_TIMEOUT (seconds a
# test may take before it is killed and fails, default 300, torch's own default; two tests have
# torch's larger overrides), TORCH_SUITE_BACKEND_TIMEOUT (seconds for one backend's whole run,
# default 14400), TORCH_SUITE_START_METHOD (forkserver, the default, or spawn: see
# torch_suite_driver.py), TORCH_SUITE_SPAWN_ALL=1 (spawn the ranks even for the CUDA-only and
# world-size skips the driver otherwise decides up front, with the same message).
#
# Output: DIR/results.jsonl, one line per test and backend ({"backend", "test", "outcome":
# passed|failed|error|skipped|missing, "seconds", "detail"}); DIR/<backend>[.<shard>].log, the
# unittest output; on stdout one JSON line of counts per backend, the tests that pass on gloo but
# not on ddp (known gaps and unexpected ones), and a last line "torch_suite: ... OK|FAILED".
# Exit status: 0, or 1 when a test passes on gloo but not on ddp without being a known gap (with
# one backend: when a test fails or errs that is not a known gap; with --require-pass: when any
# selected test does not pass), 2 on usage errors, 77 when the interpreter cannot import the
# suite (torch.testing._internal needs expecttest: scripts/requirements.txt).
set -u -o pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
here="$root/tests/python"
build="$root/build"
if [[ $# -gt 0 && "$1" != -* ]]; then build="$(cd "$1" && pwd)" || exit 2; shift; fi
py="${DDP_PYTHON:-$root/.venv/bin/python}"
backends="gloo,ddp"
jobs=1
out=""
require_pass=0
ungated=1
lift_skips=""
patterns=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -k) [[ $# -ge 2 ]] || { echo "torch_suite: -k needs a pattern" >&2; exit 2; }
        patterns+=(-k "$2"); shift 2 ;;
    --backends) backends="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --require-pass) require_pass=1; shift ;;
    --no-ungated) ungated=0; shift ;;
    --lift-skips) lift_skips="$2"; shift 2 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "torch_suite: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "torch_suite: --jobs takes a positive number" >&2; exit 2; }
out="${out:-$build/torch_suite}"
[[ -d "$build/python/ddp" ]] || { echo "torch_suite: $build/python/ddp missing (build ddp_python_ext)" >&2; exit 2; }
[[ -x "$py" ]] || { echo "torch_suite: no interpreter at $py (scripts/install-deps.sh makes .venv)" >&2; exit 2; }
mkdir -p "$out" || exit 2
results="$out/results.jsonl"
: > "$results"

# The suite's own settings. CI would switch torch's test harness to CI behaviour (XML reports).
export PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}"
export WORLD_SIZE=2
export DISTRIBUTED_TESTS_DEFAULT_TIMEOUT="${TORCH_SUITE_TEST_TIMEOUT:-300}"
unset CI
export TORCH_SUITE_LIFT_SKIPS="$lift_skips"
if ! "$py" -c 'import torch.testing._internal.common_utils' 2> "$out/import.err"; then
  echo "torch_suite: skipped: $py cannot import torch.testing._internal: $(tail -1 "$out/import.err")" \
       "(scripts/install-deps.sh installs scripts/requirements.txt)"
  exit 77
fi
backend_timeout="${TORCH_SUITE_BACKEND_TIMEOUT:-14400}"

# run_backend BACKEND LABEL ARGS...: the driver in $jobs shards, results appended to $results.
run_backend() {
  local b="$1" label="$2"; shift 2
  local pids=() i log
  for ((i = 1; i <= jobs; i++)); do
    log="$out/$label.log"; [[ $jobs -gt 1 ]] && log="$out/$label.$i.log"
    BACKEND="$b" timeout --kill-after=30 "$backend_timeout" "$py" "$here/torch_suite_driver.py" \
      "$@" --label "$label" --shard "$i/$jobs" --results "$out/$label.$i.jsonl.part" > "$log" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
  for ((i = 1; i <= jobs; i++)); do
    [[ -f "$out/$label.$i.jsonl.part" ]] && cat "$out/$label.$i.jsonl.part" >> "$results"
    rm -f "$out/$label.$i.jsonl.part"
  done
}

IFS=',' read -r -a backend_list <<< "$backends"
walls=()
start_all=$(date +%s)
for b in "${backend_list[@]}"; do
  if ! BACKEND="$b" "$py" "$here/torch_suite_driver.py" --list "${patterns[@]}" > "$out/$b.tests"; then
    echo "torch_suite: $b: the driver cannot list the tests" >&2; exit 2
  fi
  echo "torch_suite: $b: $(wc -l < "$out/$b.tests") tests, $jobs shard(s), log in $out/$b*.log"
  t0=$(date +%s)
  run_backend "$b" "$b" "${patterns[@]}"
  walls+=("$b=$(( $(date +%s) - t0 ))")
done

# The diagnostic pass: tests that passed on gloo and were skipped on ddp, on ddp without skips.
if [[ $ungated == 1 && ",$backends," == *,gloo,* && ",$backends," == *,ddp,* ]]; then
  lift=$("$py" -c '
import json, sys
o = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    o[r["backend"], r["test"]] = r["outcome"]
print(",".join(sorted(t for (b, t), v in o.items()
                      if b == "gloo" and v == "passed" and o.get(("ddp", t)) == "skipped")))
' "$results")
  if [[ -n "$lift" ]]; then
    exact=()
    for t in ${lift//,/ }; do exact+=(-k "=$t"); done
    echo "torch_suite: ddp-ungated: $(wc -w <<< "${lift//,/ }") tests skipped on ddp only, again without their skips"
    t0=$(date +%s)
    jobs=1
    TORCH_SUITE_LIFT_SKIPS="$lift" DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=60 \
      run_backend ddp ddp-ungated "${exact[@]}"
    walls+=("ddp-ungated=$(( $(date +%s) - t0 ))")
  fi
fi
wall_all=$(( $(date +%s) - start_all ))

exec "$py" - "$results" "$here/torch_suite_known_gaps.txt" "$require_pass" "$wall_all" \
  "$out" "${walls[@]}" <<'PY'
import json, sys

results, gaps_file, require_pass, wall_all, out = sys.argv[1:6]
walls = dict(a.split("=") for a in sys.argv[6:])
require_pass = require_pass == "1"

gaps = {}
with open(gaps_file) as f:
    for line in f:
        line = line.strip()
        if line and not line.startswith("#"):
            name, _, reason = line.partition(" ")
            gaps[name] = reason.strip()

outcome = {b: {} for b in walls}
detail = {b: {} for b in walls}
for line in open(results):
    r = json.loads(line)
    outcome[r["backend"]][r["test"]] = r["outcome"]
    detail[r["backend"]][r["test"]] = r.get("detail", "")
backends = [b for b in walls if b != "ddp-ungated"]
for b in backends:  # a test the run never reported (driver killed, crashed)
    for t in open(f"{out}/{b}.tests").read().split():
        outcome[b].setdefault(t, "missing")


def short(b, t):
    d = detail[b].get(t, "").strip().splitlines()
    return d[0][:160] if d else ""


kinds = ["passed", "failed", "error", "skipped", "missing"]
for b in walls:
    c = {k: sum(1 for o in outcome[b].values() if o == k) for k in kinds}
    print(json.dumps({"backend": b, "tests": len(outcome[b]), **c, "wall_s": int(walls[b])}))

bad = []
if "gloo" in backends and "ddp" in backends:
    diff = sorted(t for t, o in outcome["gloo"].items()
                  if o == "passed" and outcome["ddp"].get(t) != "passed")
    print(f"torch_suite: {len(diff)} test(s) pass on gloo but not on ddp:")
    for t in diff:
        o = outcome["ddp"][t]
        line = f"  {'known gap' if t in gaps else 'UNEXPECTED':10} {t}  ddp: {o}"
        line += f" ({short('ddp', t)})" if short("ddp", t) else ""
        if t in outcome.get("ddp-ungated", {}):
            u = outcome["ddp-ungated"][t]
            line += f"; without the skip: {u}" + (f" ({short('ddp-ungated', t)})" if u != "passed" else "")
        print(line)
        if t not in gaps:
            bad.append(t)
    for t in sorted(gaps):
        if outcome["ddp"].get(t) == "passed":
            print(f"  note: known gap {t} passes on ddp now: remove it from {gaps_file}")
for b in backends:
    for t, o in sorted(outcome[b].items()):
        if require_pass and o != "passed":
            bad.append(f"{b}:{t}")
            print(f"torch_suite: {b}: {t} {o} (--require-pass): {detail[b].get(t, '')[:600]}")
        elif len(backends) == 1 and o in ("failed", "error", "missing") and t not in gaps:
            bad.append(f"{b}:{t}")
            print(f"torch_suite: {b}: {t} {o}: {detail[b].get(t, '')[:600]}")

counts = ", ".join(
    f"{b} {sum(o == 'passed' for o in outcome[b].values())}/{len(outcome[b])} passed "
    f"({int(walls[b])} s)" for b in walls)
print(f"torch_suite: {counts}; {len(bad)} unexpected; {wall_all} s in all; results in {results}: "
      f"{'FAILED' if bad else 'OK'}")
sys.exit(1 if bad else 0)
PY
