#!/bin/bash
# ZeroRedundancyOptimizer beside PyTorch's in one run: bench_zero (ddp, ranks as threads) and
# bench_zero.py (PyTorch 1.13, gloo, processes) at world 1 and 2, alternating order per round;
# prints their JSON lines, a `zero_load` line per measurement (1-minute load average before and
# after), and a final `zero_summary` line with the median step time per configuration and the
# ratios (pytorch over ddp: above 1 means ddp's step is faster).
#   bench/ddp/run_zero.sh [BUILD_DIR] [ROUNDS] [STEPS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../python.sh"  # PY: the interpreter with PyTorch 2.13
build=${1:-$here/../../build}
rounds=${2:-3}
steps=${3:-20}
bin=$build/bench/ddp/bench_zero
[ -x "$bin" ] || { echo "bench/ddp/run_zero.sh: $bin not built (cmake --build $build --target bench_zero)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
load1() { cut -d' ' -f1 /proc/loadavg; }
measure() {
  local name=$1 world=$2 before
  shift 2
  before=$(load1)
  "$@"
  printf '{"bench":"zero_load","impl":"%s","world":%s,"load1_before":%s,"load1_after":%s}\n' \
    "$name" "$world" "$before" "$(load1)"
}
{
  for ((round = 0; round < rounds; ++round)); do
    order="ddp pytorch"
    ((round % 2 == 1)) && order="pytorch ddp"
    for impl in $order; do
      for world in 1 2; do
        if [ "$impl" = ddp ]; then
          measure ddp "$world" "$bin" --world "$world" --steps "$steps"
        else
          measure pytorch "$world" "$PY" "$here/bench_zero.py" --world "$world" --steps "$steps"
        fi
      done
    done
  done
} | tee "$out"
"$PY" - "$out" "$(nproc)" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
runs, mem, adam = {}, {}, {}
for r in rows:
    if r["bench"] == "zero":
        runs.setdefault((r["impl"], r["world"]), []).append(r["step_ms"])
        adam.setdefault(r["impl"], []).append(r["unsharded_adam_step_ms"])
        mem[(r["impl"], r["world"])] = (r["state_bytes_max_rank"], r["unsharded_state_bytes"])
med = {k: statistics.median(v) for k, v in runs.items()}
loads = [x for r in rows if r["bench"] == "zero_load" for x in (r["load1_before"], r["load1_after"])]
print(json.dumps({
    "bench": "zero_summary",
    "rounds": len(runs[("ddp", 1)]),
    "step_ms_median": {f"{i}_w{w}": v for (i, w), v in sorted(med.items())},
    "unsharded_adam_step_ms_median": {i: statistics.median(v) for i, v in sorted(adam.items())},
    "pytorch_over_ddp_w1": med[("pytorch", 1)] / med[("ddp", 1)],
    "pytorch_over_ddp_w2": med[("pytorch", 2)] / med[("ddp", 2)],
    "state_bytes_max_rank": {f"{i}_w{w}": v[0] for (i, w), v in sorted(mem.items())},
    "state_fraction_w2": {i: mem[(i, 2)][0] / mem[(i, 2)][1] for i in ("ddp", "pytorch")},
    "load1": {"min": min(loads), "max": max(loads), "cores": int(sys.argv[2])},
}))
PY
