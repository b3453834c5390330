#!/bin/bash
# Runs the DDP benchmarks beside PyTorch DDP in one run; prints JSON lines, then a summary line
# with the ratios the design brief targets.
#   bench/ddp/run.sh [BUILD_DIR] [STEPS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
steps=${2:-60}
bin=$build/bench/ddp/bench_ddp
[ -x "$bin" ] || { echo "bench/ddp/run.sh: $bin not built (cmake --build $build --target bench_ddp)" >&2; exit 1; }
out=$(mktemp)
trap 'rm -f "$out"' EXIT
{
  "$bin" overhead
  "$bin" train --world 1 --steps "$steps"
  "$bin" train --world 2 --steps "$steps"
  /usr/bin/python3 "$here/bench_ddp.py" --world 1 --steps "$steps"
  /usr/bin/python3 "$here/bench_ddp.py" --world 2 --steps "$steps"
} | tee "$out"
/usr/bin/python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
tp = {(r["impl"], r["world"]): r["samples_per_s"] for r in rows if r["bench"] == "ddp_cnn"}
over = [r for r in rows if r["bench"] == "ddp_overhead"]
print(json.dumps({
    "bench": "ddp_summary",
    "overhead_ratio_world1": over[0]["ratio"] if over else None,
    "ddp_scaling_2_over_1": tp[("ddp", 2)] / tp[("ddp", 1)],
    "pytorch_scaling_2_over_1": tp[("pytorch", 2)] / tp[("pytorch", 1)],
    "ddp_over_pytorch_world2": tp[("ddp", 2)] / tp[("pytorch", 2)],
    "targets": {"overhead_ratio_world1": "<= 1.03", "ddp_scaling_2_over_1": ">= 1.9",
                "ddp_over_pytorch_world2": ">= 1.2"}}))
PY
