#!/usr/bin/env bash
# torch.distributed from Python on the "ddp" backend against gloo, one run, 2 ranks under
# ddprun: all_reduce (float32 sum) at 4 KB, 1 MB, 16 MB, 64 MB on ddp and gloo next to the C++
# figure of ddp's cpu backend (bench/allreduce's allreduce_bench), then PyTorch DDP on the
# tutorials' CNN on ddp and gloo. Prints one JSON object per line, then summary lines with the
# ratios against the targets:
#   16 MB bus bandwidth >= 3x gloo's; 4 KB time <= 1/10 of gloo's; within 15% of the C++
#   figure at 1 MB and above; DDP CNN samples/s on ddp >= gloo's.
#
# The machine is shared: REPEAT=N (default 3) runs everything N times, interleaving ddp, gloo
# and C++ so that load changes hit all of them alike; the summary takes medians.
#
#   bench/python/run.sh [BUILD_DIR]     (default: build; builds what it needs)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../python.sh"  # PY: the interpreter with PyTorch 2.13
BUILD=${1:-$ROOT/build}
WORLD=2
SIZES=${SIZES:-4096,1048576,16777216,67108864}
STEPS=${STEPS:-60}
REPEAT=${REPEAT:-3}
cmake --build "$BUILD" --target ddprun ddp_python_ext allreduce_bench -j2 >/dev/null
DDPRUN=$BUILD/apps/ddprun/ddprun
BIN=$(find "$BUILD" -name allreduce_bench -type f -perm -u+x | head -1)
export PYTHONPATH=$BUILD/python${PYTHONPATH:+:$PYTHONPATH}
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT

launch() { "$DDPRUN" --standalone --nproc-per-node $WORLD "$@" 2> >(grep -v OMP_NUM_THREADS >&2); }

for ((rep = 0; rep < REPEAT; rep++)); do
  launch "$PY" "$ROOT/bench/python/allreduce.py" ddp "$SIZES"
  launch "$PY" "$ROOT/bench/python/allreduce.py" gloo "$SIZES"
  launch --no-python "$BIN" cpu --sizes "$SIZES"
  launch "$PY" "$ROOT/bench/python/ddp_cnn.py" ddp "$STEPS"
  launch "$PY" "$ROOT/bench/python/ddp_cnn.py" gloo "$STEPS"
done | tee "$OUT"

"$PY" - "$OUT" <<'PY'
import json, sys
from statistics import median
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
# Medians over the repetitions.
runs = {}
for r in rows:
    if r["bench"] == "allreduce":
        runs.setdefault((r["backend"], r["bytes"]), []).append(r["us"])
ar = {}
for (backend, nbytes), us in runs.items():
    m = median(us)
    ar[(backend, nbytes)] = {"us": round(m, 2), "runs": len(us),
                             "busbw_gbps": round(nbytes * 2.0 * (2 - 1) / 2 / (m * 1e-6) / 1e9, 3)}
for nbytes in sorted({b for _, b in ar}):
    d, g, c = (ar.get((k, nbytes)) for k in ("torch-ddp", "torch-gloo", "cpu"))
    if not d:
        continue
    out = {"bench": "python_allreduce_summary", "bytes": nbytes, "runs": d["runs"],
           "ddp_us": d["us"], "ddp_busbw_gbps": d["busbw_gbps"]}
    if g:
        out["gloo_us"] = g["us"]
        out["gloo_busbw_gbps"] = g["busbw_gbps"]
        out["speedup_vs_gloo"] = round(g["us"] / d["us"], 2)
    if c:
        out["cpp_us"] = c["us"]
        out["ddp_over_cpp_time"] = round(d["us"] / c["us"], 3)
    if nbytes == 4096 and g:
        out["target"] = "time <= gloo/10"
        out["meets_target"] = d["us"] <= g["us"] / 10
    if nbytes == 16 << 20 and g:
        out["target"] = "busbw >= 3x gloo; within 15% of C++"
        out["meets_target"] = d["busbw_gbps"] >= 3 * g["busbw_gbps"] and \
            (not c or d["us"] <= 1.15 * c["us"])
    elif nbytes >= 1 << 20 and c:
        out["target"] = "within 15% of C++"
        out["meets_target"] = d["us"] <= 1.15 * c["us"]
    print(json.dumps(out))
cnn = {}
for r in rows:
    if r["bench"] == "ddp_cnn":
        cnn.setdefault(r["backend"], []).append(r["samples_per_s"])
if "ddp" in cnn and "gloo" in cnn:
    d, g = median(cnn["ddp"]), median(cnn["gloo"])
    print(json.dumps({"bench": "python_ddp_cnn_summary", "runs": len(cnn["ddp"]),
                      "ddp_samples_per_s": d, "gloo_samples_per_s": g,
                      "ddp_runs": cnn["ddp"], "gloo_runs": cnn["gloo"],
                      "ddp_over_gloo": round(d / g, 3), "target": "ddp >= gloo",
                      "meets_target": d >= g}))
PY
