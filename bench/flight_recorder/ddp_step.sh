#!/bin/bash
# What the flight recorder costs a DDP step: the Fashion-MNIST CNN of bench/ddp (`bench_ddp
# train --world 2`: 2 processes, Adam, batch 64 per rank, the cpu backend) with the recorder on
# (DDP_FLIGHT_RECORDER_ENTRIES=2000, the default) and off (0), in alternating order, plus
# PyTorch's DDP (gloo, no recorder) in the same rounds as the yardstick. Prints the runs'
# JSON lines, a `ddp_load` line (1-minute load average) after each, then one
# `flight_recorder_ddp_summary` line: the median ms per step of each, the recorder's cost in
# % of the step (median of the per-round differences: on a loaded machine this is noise,
# far above the recorder's own cost), and the estimate from the parts: the recorder's cost per
# collective (flight_recorder_bench: all_reduce on a world-1 group, on minus off) times the
# collectives per step (bucket all-reduces counted in a DDP timeline of a short run) over the
# step time. CPU ms per step (the busiest rank's) are given too: less sensitive than wall time
# to waiting for a core.
#   bench/flight_recorder/ddp_step.sh [BUILD_DIR] [STEPS] [ROUNDS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../python.sh"  # PY: the interpreter with PyTorch 2.13
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
        pytorch) run pytorch "$PY" "$here/../ddp/bench_ddp.py" --world 2 --steps "$steps" ;;
      esac
    done
  done
  "$build/bench/flight_recorder/flight_recorder_bench"
  tl=$(mktemp -d)
  "$bin" train --world 2 --steps 10 --warmup 5 --timeline "$tl/tl_rank{rank}.json" >/dev/null
  "$PY" -c '
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
n = sum(1 for e in events if e.get("name", "").startswith("allreduce bucket"))
steps = sum(1 for e in events if e.get("name") == "backward")
print(json.dumps({"bench": "ddp_timeline_count", "bucket_allreduces": n, "backwards": steps}))' \
    "$tl/tl_rank0.json"
  rm -rf "$tl"
} | tee "$out"
"$PY" - "$out" "$steps" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
runs, cpu = {}, {}
for r in rows:
    if r.get("bench") == "ddp_cnn":
        runs.setdefault(r["recorder"], []).append(1e3 * r["seconds"] / r["steps"])
        cpu.setdefault(r["recorder"], []).append(r["cpu_ms_per_step_max_rank"])
med = {k: statistics.median(v) for k, v in runs.items()}
pairs = [100.0 * (a - b) / b for a, b in zip(runs.get("on", []), runs.get("off", []))]
loads = [r["load1"] for r in rows if r.get("bench") == "ddp_load"]
ring = {}
for r in rows:
    if r.get("bench") == "flight_recorder" and r.get("what") == "all_reduce_world1":
        ring.setdefault(r["entries"], []).append(r["ns_per_collective"])
ns_per = statistics.median(ring[2000]) - statistics.median(ring[0]) if 0 in ring and 2000 in ring else None
count = next((r for r in rows if r.get("bench") == "ddp_timeline_count"), None)
per_step = count["bucket_allreduces"] / count["backwards"] if count and count["backwards"] else None
est_pct = (100.0 * ns_per * 1e-6 * per_step / med["off"]) if ns_per and per_step and med.get("off") else None
print(json.dumps({
    "bench": "flight_recorder_ddp_summary", "world": 2, "steps": int(sys.argv[2]),
    "ms_per_step_recorder_on": round(med.get("on", 0), 2),
    "ms_per_step_recorder_off": round(med.get("off", 0), 2),
    "ms_per_step_pytorch": round(med.get("pytorch", 0), 2),
    "cpu_ms_per_step_on": round(statistics.median(cpu["on"]), 2) if "on" in cpu else None,
    "cpu_ms_per_step_off": round(statistics.median(cpu["off"]), 2) if "off" in cpu else None,
    "recorder_cost_pct_of_step_median_of_pairs": round(statistics.median(pairs), 2) if pairs else None,
    "recorder_cost_pct_each_round": [round(p, 2) for p in pairs],
    "recorder_ns_per_collective": round(ns_per, 1) if ns_per is not None else None,
    "collectives_per_step": per_step,
    "recorder_cost_pct_of_step_estimate": est_pct,
    "load1_max": max(loads) if loads else None}))
PY
