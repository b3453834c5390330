#!/bin/bash
# What the flight recorder costs a DDP step: the Fashion-MNIST CNN of bench/ddp (`bench_ddp
# train --world 2`: 2 processes, Adam, batch 64 per rank, the cpu backend) with the recorder on
# (DDP_FLIGHT_RECORDER_ENTRIES=2000, the default) and off (0), in alternating order, plus
# PyTorch's DDP (gloo, no recorder) in the same rounds as the yardstick. Prints the runs'
# JSON lines, a `ddp_load` line (1-minute load average) after each, then one
# `flight_recorder_ddp_summary` line: the median ms per step of each, the recorder's cost in
# % of the step (median of the per-round differences), and the collectives per step the
# recorder logged (from a short extra run that dumps its ring).
#   bench/flight_recorder/ddp_step.sh [BUILD_DIR] [STEPS] [ROUNDS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
steps=${2:-60}
rounds=${3:-5}
bin=$build/bench/ddp/bench_ddp
[ -x "$bin" ] || { echo "ddp_step.sh: $bin not built (cmake --build $build --target bench_ddp)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
load1() { cut -d' ' -f1 /proc/loadavg; }
run() {  # run LABEL CMD...: prefixes the JSON line with the label
  local label=$1
  shift
  "$@" | sed -n "s/^{/{\"recorder\":\"$label\",/p"
  printf '{"bench":"ddp_load","recorder":"%s","load1":%s}\n' "$label" "$(load1)"
}
{
  for ((round = 0; round < rounds; ++round)); do
    order="on off pytorch"
    ((round % 2 == 1)) && order="pytorch off on"
    for what in $order; do
      case $what in
        on) DDP_FLIGHT_RECORDER_ENTRIES=2000 run on "$bin" train --world 2 --steps "$steps" ;;
        off) DDP_FLIGHT_RECORDER_ENTRIES=0 run off "$bin" train --world 2 --steps "$steps" ;;
        pytorch) run pytorch /usr/bin/python3 "$here/../ddp/bench_ddp.py" --world 2 --steps "$steps" ;;
      esac
    done
  done
} | tee "$out"
/usr/bin/python3 - "$out" "$steps" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
runs = {}
for r in rows:
    if r.get("bench") == "ddp_cnn":
        runs.setdefault(r["recorder"], []).append(1e3 * r["seconds"] / r["steps"])
med = {k: statistics.median(v) for k, v in runs.items()}
pairs = [100.0 * (a - b) / b for a, b in zip(runs.get("on", []), runs.get("off", []))]
loads = [r["load1"] for r in rows if r.get("bench") == "ddp_load"]
print(json.dumps({
    "bench": "flight_recorder_ddp_summary", "world": 2, "steps": int(sys.argv[2]),
    "ms_per_step_recorder_on": round(med.get("on", 0), 2),
    "ms_per_step_recorder_off": round(med.get("off", 0), 2),
    "ms_per_step_pytorch": round(med.get("pytorch", 0), 2),
    "recorder_cost_pct_of_step_median_of_pairs": round(statistics.median(pairs), 2) if pairs else None,
    "recorder_cost_pct_each_round": [round(p, 2) for p in pairs],
    "load1_max": max(loads) if loads else None}))
PY
