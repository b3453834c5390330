#!/bin/bash
# Runs the DDP benchmarks beside PyTorch DDP in one run; prints JSON lines, then one final
# `ddp_summary` line with the medians and the ratios against the design brief's targets.
#   bench/ddp/run.sh [BUILD_DIR] [STEPS] [ROUNDS]
# Each round runs the world-1 overhead bench and every training configuration once (ddp and
# pytorch, world 1 and 2, in alternating order), plus `independent` at world 2: two processes
# training the same CNN without any communication. On a 2-core machine that is the ceiling
# for 2 ranks (busy cores slow each other through the shared L3 cache and memory bandwidth),
# so `ddp_w2_over_ceiling` tells the cost of DDP itself apart from the machine's. Two
# diagnostic DDP runs at world 2 split that cost: `ddp_hook_none` (buckets filled and copied
# back, nothing reduced) and `ddp_hook_sync` (one element all-reduced per bucket: the ranks'
# lockstep without the data); `hook_sync_scaling_2_over_1` bounds what any all-reduce can reach.
# ddp and PyTorch run with DDP's default options and, as `*_bucket_view`, both with
# gradient_as_bucket_view (gradients live in the all-reduce buckets: two copies of every
# gradient per step fewer). `ddp_fused_adam` is ddp with ddp::FusedAdam instead of
# torch::optim::Adam (the same update in one pass over memory; PyTorch 1.13 has no fused CPU
# Adam to set beside it, so the headline ratios keep torch::optim::Adam on both sides).
# The C++ bench calls ddp::keep_freed_memory() (include/ddp/util/malloc_tuning.hpp); PyTorch
# runs as shipped and, as `pytorch_malloc_tuned`, with the same glibc settings from the
# environment, so the summary shows how much of the lead over PyTorch is that setting. Every measurement is followed by a
# `ddp_load` line with the 1-minute load average before and after it: on a shared machine a
# figure taken at a load above the core count measures the other jobs, not the code.
# The summary's headline figures are the medians over rounds; `best` (each configuration's
# fastest round, the one least disturbed by other load) and `paired_median` (each ratio within
# one round, then the median over rounds) are reported beside them.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../python.sh"  # PY: the interpreter with PyTorch 2.13
build=${1:-$here/../../build}
steps=${2:-40}
rounds=${3:-3}
bin=$build/bench/ddp/bench_ddp
[ -x "$bin" ] || { echo "bench/ddp/run.sh: $bin not built (cmake --build $build --target bench_ddp)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT

load1() { cut -d' ' -f1 /proc/loadavg; }
# measure NAME WORLD CMD...: runs CMD, then prints the load line for it.
measure() {
  local name=$1 world=$2 before
  shift 2
  before=$(load1)
  "$@"
  printf '{"bench":"ddp_load","impl":"%s","world":%s,"load1_before":%s,"load1_after":%s}\n' \
    "$name" "$world" "$before" "$(load1)"
}

{
  for ((round = 0; round < rounds; ++round)); do
    measure overhead 1 "$bin" overhead --steps 20 --blocks 3
    order="ddp ddp_fused_adam ddp_bucket_view pytorch pytorch_bucket_view tuned"
    if ((round % 2 == 1)); then
      order="tuned pytorch_bucket_view pytorch ddp_bucket_view ddp_fused_adam ddp"
    fi
    measure independent 2 "$bin" train --world 2 --independent --steps "$steps"
    for hook in none sync; do
      measure "ddp_hook_$hook" 2 "$bin" train --world 2 --comm-hook "$hook" --steps "$steps"
    done
    for impl in $order; do
      for world in 1 2; do
        if [ "$impl" = ddp ]; then
          measure ddp "$world" "$bin" train --world "$world" --steps "$steps"
        elif [ "$impl" = ddp_fused_adam ]; then
          measure "$impl" "$world" "$bin" train --world "$world" --steps "$steps" \
            --optimizer fused-adam
        elif [ "$impl" = ddp_bucket_view ]; then
          measure "$impl" "$world" "$bin" train --world "$world" --steps "$steps" \
            --gradient-as-bucket-view
        elif [ "$impl" = pytorch_bucket_view ]; then
          measure "$impl" "$world" "$PY" "$here/bench_ddp.py" --world "$world" \
            --steps "$steps" --gradient-as-bucket-view
        elif [ "$impl" = tuned ]; then
          MALLOC_TRIM_THRESHOLD_=1073741824 MALLOC_MMAP_THRESHOLD_=33554432 \
            measure pytorch_malloc_tuned "$world" "$PY" "$here/bench_ddp.py" \
            --world "$world" --steps "$steps"
        else
          measure pytorch "$world" "$PY" "$here/bench_ddp.py" --world "$world" --steps "$steps"
        fi
      done
    done
  done
} | tee "$out"
"$PY" - "$out" "$(nproc)" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
cores = int(sys.argv[2])
def collect(field):
    out = {}
    for r in rows:
        if r["bench"] == "ddp_cnn" and field in r:
            impl = r["impl"] + ("_bucket_view" if r.get("gradient_as_bucket_view") else "")
            if r.get("comm_hook") in ("none", "sync"):
                impl += "_hook_" + r["comm_hook"]
            if r.get("optimizer", "").startswith("fused-adam"):
                impl += "_fused_adam"
            out.setdefault((impl, r["world"]), []).append(r[field])
    return out
runs = collect("samples_per_s")
cpu = {k: statistics.median(v) for k, v in collect("cpu_ms_per_step_max_rank").items()}
best = {k: max(v) for k, v in runs.items()}
med = {k: statistics.median(v) for k, v in runs.items()}
over = [r["ratio"] for r in rows if r["bench"] == "ddp_overhead"]
loads = [x for r in rows if r["bench"] == "ddp_load" for x in (r["load1_before"], r["load1_after"])]
def ratios(t):
    return {"ddp_scaling_2_over_1": t[("ddp", 2)] / t[("ddp", 1)],
            "pytorch_scaling_2_over_1": t[("pytorch", 2)] / t[("pytorch", 1)],
            "ddp_over_pytorch_world2": t[("ddp", 2)] / t[("pytorch", 2)],
            "ddp_bucket_view_scaling_2_over_1":
                t[("ddp_bucket_view", 2)] / t[("ddp_bucket_view", 1)],
            "pytorch_bucket_view_scaling_2_over_1":
                t[("pytorch_bucket_view", 2)] / t[("pytorch_bucket_view", 1)],
            "ddp_bucket_view_over_pytorch_bucket_view_world2":
                t[("ddp_bucket_view", 2)] / t[("pytorch_bucket_view", 2)],
            "ddp_bucket_view_w2_over_ceiling": t[("ddp_bucket_view", 2)] / t[("independent", 2)],
            "ddp_fused_adam_scaling_2_over_1": t[("ddp_fused_adam", 2)] / t[("ddp_fused_adam", 1)],
            "ddp_fused_adam_over_ddp_world1": t[("ddp_fused_adam", 1)] / t[("ddp", 1)],
            "ddp_fused_adam_over_ddp_world2": t[("ddp_fused_adam", 2)] / t[("ddp", 2)],
            "ddp_fused_adam_over_pytorch_world2": t[("ddp_fused_adam", 2)] / t[("pytorch", 2)],
            # The machine's ceiling: 2 processes without communication over 1 rank.
            "ceiling_scaling_2_over_1": t[("independent", 2)] / t[("ddp", 1)],
            "ddp_w2_over_ceiling": t[("ddp", 2)] / t[("independent", 2)],
            "pytorch_w2_over_ceiling": t[("pytorch", 2)] / t[("independent", 2)],
            "hook_none_w2_over_ceiling": t[("ddp_hook_none", 2)] / t[("independent", 2)],
            "hook_sync_w2_over_ceiling": t[("ddp_hook_sync", 2)] / t[("independent", 2)],
            "hook_sync_scaling_2_over_1": t[("ddp_hook_sync", 2)] / t[("ddp", 1)],
            "pytorch_malloc_tuned_scaling_2_over_1":
                t[("pytorch_malloc_tuned", 2)] / t[("pytorch_malloc_tuned", 1)],
            "ddp_over_pytorch_malloc_tuned_world2": t[("ddp", 2)] / t[("pytorch_malloc_tuned", 2)]}
m = ratios(med)
# Paired: each ratio taken within one round (its configurations ran minutes apart), then the
# median over rounds; a slow stretch of the machine then moves both sides of a ratio.
per_round = [ratios({k: v[i] for k, v in runs.items()}) for i in range(len(runs[("ddp", 1)]))]
paired = {k: statistics.median(r[k] for r in per_round) for k in m}
overhead = statistics.median(over) if over else None
print(json.dumps({
    "bench": "ddp_summary",
    "rounds": len(runs[("ddp", 1)]),
    "samples_per_s_median": {f"{i}_w{w}": v for (i, w), v in sorted(med.items())},
    "samples_per_s_best": {f"{i}_w{w}": v for (i, w), v in sorted(best.items())},
    "overhead_ratio_world1_median": overhead,
    "median": m,
    "paired_median": paired,
    "best": ratios(best),
    "targets": {"overhead_ratio_world1": "<= 1.03", "ddp_scaling_2_over_1": ">= 1.9",
                "ddp_over_pytorch_world2": ">= 1.2"},
    "met_by_paired_median": {
        "ddp_scaling_2_over_1": paired["ddp_scaling_2_over_1"] >= 1.9,
        "ddp_over_pytorch_world2": paired["ddp_over_pytorch_world2"] >= 1.2},
    "met_by_median": {
        "overhead_ratio_world1": overhead is not None and overhead <= 1.03,
        "ddp_scaling_2_over_1": m["ddp_scaling_2_over_1"] >= 1.9,
        "ddp_over_pytorch_world2": m["ddp_over_pytorch_world2"] >= 1.2},
    # CPU time per step (slowest rank, median over rounds): what throughput would be if every
    # rank had a core to itself. A projection, not a measured throughput.
    "cpu_ms_per_step": {f"{i}_w{w}": v for (i, w), v in sorted(cpu.items())},
    "cpu_projected": {
        "ceiling_scaling_2_over_1": 2 * cpu[("ddp", 1)] / cpu[("independent", 2)],
        "ddp_scaling_2_over_1": 2 * cpu[("ddp", 1)] / cpu[("ddp", 2)],
        "pytorch_scaling_2_over_1": 2 * cpu[("pytorch", 1)] / cpu[("pytorch", 2)],
        "ddp_over_pytorch_world2": cpu[("pytorch", 2)] / cpu[("ddp", 2)]},
    "load1": {"min": min(loads), "max": max(loads), "cores": cores,
              "quiet": max(loads) < cores + 0.5},
}))
PY
