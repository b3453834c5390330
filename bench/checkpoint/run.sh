#!/bin/bash
# Checkpoint stall per save and job slowdown, ddp's Checkpointer (async and sync) against
# PyTorch 2.13's dcp.async_save and dcp.save, on the same state in the same run: ~1 GB of
# synthetic float32 parameters, and the tutorial CNN with Adam. One rank; the loop runs a fixed
# matmul workload per step and saves every 25 steps (about 2 s). Rounds alternate the order. Prints each
# run's JSON line, then a `checkpoint_summary` line per state: medians over rounds and the
# ratios (ddp async stall / ddp sync save time; ddp async stall / dcp.async_save stall), with
# the machine's load.
#   bench/checkpoint/run.sh [BUILD_DIR] [ROUNDS] [DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../python.sh"  # PY: the interpreter with PyTorch 2.13
build=${1:-$here/../../build}
rounds=${2:-3}
dir=${3:-$(mktemp -d /tmp/ddp_bench_ckpt_XXXXXX)}
bin=$build/bench/checkpoint/bench_checkpoint
[ -x "$bin" ] || { echo "bench/checkpoint/run.sh: $bin not built" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"; rm -rf "$dir"' EXIT

for state in 1gb cnn; do
  for ((i = 0; i < rounds; i++)); do
    configs=("ddp async" "ddp sync" "dcp async" "dcp sync")
    ((i % 2)) && configs=("dcp sync" "dcp async" "ddp sync" "ddp async")
    for c in "${configs[@]}"; do
      set -- $c
      if [ "$1" = ddp ]; then
        "$bin" --state "$state" --mode "$2" --dir "$dir/run" | tee -a "$out"
      else
        "$PY" -W ignore "$here/bench_dcp.py" --state "$state" --mode "$2" --dir "$dir/run" \
          | tee -a "$out"
      fi
    done
  done
done

"$PY" - "$out" <<'PYEOF'
import json, os, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
load = os.getloadavg()[0]
for state in ("1gb", "cnn"):
    med = {}
    for impl in ("ddp", "pytorch-dcp"):
        for mode in ("async", "sync"):
            r = [x for x in rows if x["state"] == state and x["impl"] == impl and x["mode"] == mode]
            med[impl, mode] = {k: statistics.median(x[k] for x in r)
                               for k in ("stall_s_median", "job_s", "slowdown")}
    print(json.dumps({
        "bench": "checkpoint_summary", "state": state, "rounds": len(r), "load1": round(load, 2),
        "ddp_async_stall_s": med["ddp", "async"]["stall_s_median"],
        "ddp_sync_save_s": med["ddp", "sync"]["stall_s_median"],
        "dcp_async_stall_s": med["pytorch-dcp", "async"]["stall_s_median"],
        "dcp_sync_save_s": med["pytorch-dcp", "sync"]["stall_s_median"],
        "ddp_async_stall_over_sync": round(med["ddp", "async"]["stall_s_median"]
                                           / med["ddp", "sync"]["stall_s_median"], 4),
        "ddp_async_stall_over_dcp_async": round(med["ddp", "async"]["stall_s_median"]
                                                / med["pytorch-dcp", "async"]["stall_s_median"], 4),
        "ddp_async_slowdown": med["ddp", "async"]["slowdown"],
        "dcp_async_slowdown": med["pytorch-dcp", "async"]["slowdown"],
        "ddp_sync_slowdown": med["ddp", "sync"]["slowdown"],
        "dcp_sync_slowdown": med["pytorch-dcp", "sync"]["slowdown"]}))
PYEOF
