#!/bin/bash
# Runs the DDP benchmarks beside PyTorch DDP in one run; prints JSON lines, then a summary line
# with the ratios the design brief targets.
#   bench/ddp/run.sh [BUILD_DIR] [STEPS] [ROUNDS]
# Each round runs every configuration once (ddp and pytorch, world 1 and 2, in alternating
# order); the summary uses each configuration's best round (the one least disturbed by other
# load on the machine) and also reports medians.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
steps=${2:-40}
rounds=${3:-3}
bin=$build/bench/ddp/bench_ddp
[ -x "$bin" ] || { echo "bench/ddp/run.sh: $bin not built (cmake --build $build --target bench_ddp)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
{
  "$bin" overhead --steps 20 --blocks 3
  for ((round = 0; round < rounds; ++round)); do
    if ((round % 2 == 0)); then order="ddp pytorch"; else order="pytorch ddp"; fi
    for impl in $order; do
      for world in 1 2; do
        if [ "$impl" = ddp ]; then
          "$bin" train --world "$world" --steps "$steps"
        else
          /usr/bin/python3 "$here/bench_ddp.py" --world "$world" --steps "$steps"
        fi
      done
    done
  done
} | tee "$out"
/usr/bin/python3 - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
runs = {}
for r in rows:
    if r["bench"] == "ddp_cnn":
        runs.setdefault((r["impl"], r["world"]), []).append(r["samples_per_s"])
cpu = {}
for r in rows:
    if r["bench"] == "ddp_cnn" and "cpu_ms_per_step_max_rank" in r:
        cpu.setdefault((r["impl"], r["world"]), []).append(r["cpu_ms_per_step_max_rank"])
cpu = {k: statistics.median(v) for k, v in cpu.items()}
best = {k: max(v) for k, v in runs.items()}
med = {k: statistics.median(v) for k, v in runs.items()}
over = [r for r in rows if r["bench"] == "ddp_overhead"]
def ratios(t):
    return {"ddp_scaling_2_over_1": t[("ddp", 2)] / t[("ddp", 1)],
            "pytorch_scaling_2_over_1": t[("pytorch", 2)] / t[("pytorch", 1)],
            "ddp_over_pytorch_world2": t[("ddp", 2)] / t[("pytorch", 2)]}
print(json.dumps({
    "bench": "ddp_summary",
    "overhead_ratio_world1": over[0]["ratio"] if over else None,
    "samples_per_s_best": {f"{i}_w{w}": v for (i, w), v in sorted(best.items())},
    "best": ratios(best), "median": ratios(med), "rounds": len(runs[("ddp", 1)]),
    # CPU time per step (slowest rank, median over rounds): what throughput would be if every
    # rank had a core to itself. A projection, not a measured throughput.
    "cpu_ms_per_step": {f"{i}_w{w}": v for (i, w), v in sorted(cpu.items())},
    "cpu_projected": {
        "ddp_scaling_2_over_1": 2 * cpu[("ddp", 1)] / cpu[("ddp", 2)],
        "pytorch_scaling_2_over_1": 2 * cpu[("pytorch", 1)] / cpu[("pytorch", 2)],
        "ddp_over_pytorch_world2": cpu[("pytorch", 2)] / cpu[("ddp", 2)]},
    "targets": {"overhead_ratio_world1": "<= 1.03", "ddp_scaling_2_over_1": ">= 1.9",
                "ddp_over_pytorch_world2": ">= 1.2"}}))
PY
