#!/bin/bash
# The tutorial workload end to end: examples/mnist (C++, launched by ddprun) against its Python
# twin examples/mnist/mnist.py (PyTorch DDP on gloo, launched by torchrun), 2 ranks, default
# batch size (32 per rank), ROUNDS alternating rounds. Prints one JSON line per run (the
# samples/s from each program's "Training time" line, which excludes start-up, data loading
# and the test pass) with the 1-minute load average before and after, then a summary line.
#   bench/ddp/mnist_example.sh [BUILD_DIR] [MAX_STEPS=300] [ROUNDS=3]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../python.sh"  # PY: the interpreter with PyTorch 2.13
root=$here/../..
build=${1:-$root/build}
max_steps=${2:-300}
rounds=${3:-3}
ddprun=$build/apps/ddprun/ddprun
mnist=$build/examples/mnist/mnist
for b in "$ddprun" "$mnist"; do
  [ -x "$b" ] || { echo "bench/ddp/mnist_example.sh: $b not built (targets ddprun mnist)" >&2; exit 1; }
done
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
out=$logs/rows

load1() { cut -d' ' -f1 /proc/loadavg; }
# run IMPL CMD...: runs CMD and prints its JSON line.
run() {
  local impl=$1 before rate
  shift
  before=$(load1)
  rate=$("$@" 2>&1 | grep -o 'Training time = .*samples/s' | grep -o '[0-9.]* samples/s' |
    grep -o '^[0-9.]*' || true)
  [ -n "$rate" ] || { echo "bench/ddp/mnist_example.sh: $impl printed no Training time line" >&2; exit 1; }
  printf '{"bench":"mnist_example","impl":"%s","world":2,"batch_per_rank":32,"max_steps":%s,"samples_per_s":%s,"load1_before":%s,"load1_after":%s}\n' \
    "$impl" "$max_steps" "$rate" "$before" "$(load1)"
}
cpp() { run ddp "$ddprun" --standalone --nproc-per-node 2 "$mnist" --epochs 1 --max-steps "$max_steps"; }
# Debian's torchrun needs --redirects/--tee/--log_dir (it fails on the default None map).
py() {
  run pytorch /usr/bin/torchrun --standalone --nproc_per_node 2 --redirects 1 --tee 1 \
    --log_dir "$logs/torchrun.$RANDOM" "$root/examples/mnist/mnist.py" --epochs 1 \
    --max-steps "$max_steps"
}
{
  for ((round = 0; round < rounds; ++round)); do
    if ((round % 2 == 0)); then cpp; py; else py; cpp; fi
  done
} | tee "$out"
"$PY" - "$out" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rate = {i: statistics.median(r["samples_per_s"] for r in rows if r["impl"] == i)
        for i in ("ddp", "pytorch")}
loads = [x for r in rows for x in (r["load1_before"], r["load1_after"])]
print(json.dumps({"bench": "mnist_example_summary", "rounds": len(rows) // 2,
                  "samples_per_s_median": rate,
                  "ddp_over_pytorch_median": rate["ddp"] / rate["pytorch"],
                  "load1": {"min": min(loads), "max": max(loads)}}))
PY
