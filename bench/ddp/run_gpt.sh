#!/bin/bash
# The GPT-style model (include/ddp/torch/models/gpt.hpp, 13.8 M parameters) under ddp's DDP and
# under PyTorch's, in one run; prints JSON lines, then one `gpt_summary` line.
#   bench/ddp/run_gpt.sh [BUILD_DIR] [STEPS=20] [ROUNDS=3]
# Each round runs ddp and pytorch at world 1 and 2 and `independent` at world 2 (two processes
# training the same model without any communication: the machine's ceiling for 2 ranks), in
# alternating order (reversed every other round). Both sides: the same model, initialization,
# Markov-chain tokens, AdamW, batch 8 x 128 tokens per rank, one intra-op thread per rank,
# separate processes over env://; ddp on its `cpu` backend with its timeline on (the JSON then
# has the wait for peers and the all-reduce time per step), PyTorch's
# torch.nn.parallel.DistributedDataParallel on gloo, run by ${DDP_PYTHON:-<repo>/.venv/bin/python}.
# GPT_ARGS adds flags to both sides, e.g. a smoke run of the script:
#   GPT_ARGS="--layers 2 --d-model 64 --heads 4 --vocab 512 --seq 32 --batch 4" run_gpt.sh build 5 1
# Every measurement is followed by a `gpt_load` line with the 1-minute load average before and
# after it: a figure taken at a load above the core count measures the other jobs too.
# The summary's headline figures are medians over rounds; `paired_median` takes each ratio
# within one round first (a slow stretch of the machine then moves both sides of a ratio).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
build=${1:-$repo/build}
steps=${2:-20}
rounds=${3:-3}
py=${DDP_PYTHON:-$repo/.venv/bin/python}
read -r -a extra <<<"${GPT_ARGS:-}"
bin=$build/bench/ddp/bench_gpt
[ -x "$bin" ] || { echo "bench/ddp/run_gpt.sh: $bin not built (cmake --build $build --target bench_gpt)" >&2; exit 1; }
[ -x "$py" ] || { echo "bench/ddp/run_gpt.sh: no Python at $py (set DDP_PYTHON)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

load1() { cut -d' ' -f1 /proc/loadavg; }
# measure NAME WORLD CMD...: runs CMD, then prints the load line for it.
measure() {
  local name=$1 world=$2 before
  shift 2
  before=$(load1)
  "$@"
  printf '{"bench":"gpt_load","impl":"%s","world":%s,"load1_before":%s,"load1_after":%s}\n' \
    "$name" "$world" "$before" "$(load1)"
}
run_one() {
  case $1 in
    ddp) measure ddp "$2" "$bin" --world "$2" --steps "$steps" "${extra[@]}" \
           --timeline "$tmp/tl_w$2_rank{rank}.json" ;;
    pytorch) measure pytorch "$2" "$py" "$here/bench_gpt.py" --world "$2" --steps "$steps" "${extra[@]}" ;;
    independent) measure independent "$2" "$bin" --world "$2" --steps "$steps" "${extra[@]}" \
                   --independent ;;
  esac
}

{
  for ((round = 0; round < rounds; ++round)); do
    order="ddp:1 ddp:2 pytorch:1 pytorch:2 independent:2"
    if ((round % 2 == 1)); then order="independent:2 pytorch:2 pytorch:1 ddp:2 ddp:1"; fi
    for run in $order; do run_one "${run%:*}" "${run#*:}"; done
  done
} | tee "$tmp/out"
"$py" - "$tmp/out" "$(nproc)" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
cores = int(sys.argv[2])
runs = {}
for r in rows:
    if r["bench"] == "gpt":
        runs.setdefault((r["impl"], r["world"]), []).append(r)
def med(key, field):
    v = [r[field] for r in runs.get(key, []) if field in r]
    return statistics.median(v) if v else None
def cpu(impl, world):
    return med((impl, world), "cpu_ms_per_step_max_rank")
def ratios(t):
    return {"ddp_over_pytorch_world1": t[("ddp", 1)] / t[("pytorch", 1)],
            "ddp_over_pytorch_world2": t[("ddp", 2)] / t[("pytorch", 2)],
            "ddp_scaling_2_over_1": t[("ddp", 2)] / t[("ddp", 1)],
            "pytorch_scaling_2_over_1": t[("pytorch", 2)] / t[("pytorch", 1)],
            # The machine's ceiling: 2 processes without communication over 1 rank.
            "ceiling_scaling_2_over_1": t[("independent", 2)] / t[("ddp", 1)],
            "ddp_w2_over_ceiling": t[("ddp", 2)] / t[("independent", 2)],
            "pytorch_w2_over_ceiling": t[("pytorch", 2)] / t[("independent", 2)]}
tps = {k: statistics.median(r["tokens_per_s"] for r in v) for k, v in runs.items()}
n = min(len(v) for v in runs.values())
per_round = [ratios({k: v[i]["tokens_per_s"] for k, v in runs.items()}) for i in range(n)]
m = ratios(tps)
loads = [x for r in rows if r["bench"] == "gpt_load" for x in (r["load1_before"], r["load1_after"])]
fields = ["step_ms_median", "forward_ms_median", "backward_ms_median", "optimizer_ms_median",
          "cpu_ms_per_step_max_rank", "wait_for_peers_ms_per_step", "allreduce_ms_per_step"]
print(json.dumps({
    "bench": "gpt_summary",
    "rounds": n,
    "params": rows[0].get("params"),
    "tokens_per_s_median": {f"{i}_w{w}": v for (i, w), v in sorted(tps.items())},
    "median": m,
    "paired_median": {k: statistics.median(r[k] for r in per_round) for k in m},
    # Per configuration, medians over rounds of each run's (slowest rank's) figures, in ms.
    "breakdown_ms": {f"{i}_w{w}": {f: med((i, w), f) for f in fields if med((i, w), f) is not None}
                     for (i, w) in sorted(runs)},
    "mean_loss": {f"{i}_w{w}": med((i, w), "mean_loss") for (i, w) in sorted(runs)},
    # CPU time per step (slowest rank): what the ratios would be if every rank had a core to
    # itself. A projection for loaded machines, not a measured throughput.
    "cpu_projected": {
        "ceiling_scaling_2_over_1": 2 * cpu("ddp", 1) / cpu("independent", 2),
        "ddp_scaling_2_over_1": 2 * cpu("ddp", 1) / cpu("ddp", 2),
        "pytorch_scaling_2_over_1": 2 * cpu("pytorch", 1) / cpu("pytorch", 2),
        "ddp_over_pytorch_world1": cpu("pytorch", 1) / cpu("ddp", 1),
        "ddp_over_pytorch_world2": cpu("pytorch", 2) / cpu("ddp", 2)},
    "load1": {"min": min(loads), "max": max(loads), "cores": cores,
              "quiet": max(loads) < cores + 0.5},
}))
PY
