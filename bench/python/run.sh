#!/usr/bin/env bash
# torch.distributed from Python on the "ddp" backend against gloo, one run, 2 ranks under
# ddprun: all_reduce (float32 sum) at 4 KB, 1 MB, 16 MB, 64 MB on ddp and gloo next to the C++
# figure of ddp's cpu backend (bench/allreduce's allreduce_bench), then PyTorch DDP on the
# tutorials' CNN on ddp and gloo. Prints one JSON object per line, then summary lines with the
# ratios against the targets:
#   16 MB bus bandwidth >= 3x gloo's; 4 KB time <= 1/10 of gloo's; within 15% of the C++
#   figure at 1 MB and above; DDP CNN samples/s on ddp >= gloo's.
#
#   bench/python/run.sh [BUILD_DIR]     (default: build; builds what it needs)
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build}
WORLD=2
SIZES=${SIZES:-4096,1048576,16777216,67108864}
STEPS=${STEPS:-60}
cmake --build "$BUILD" --target ddprun ddp_python_ext allreduce_bench -j2 >/dev/null
DDPRUN=$BUILD/apps/ddprun/ddprun
BIN=$(find "$BUILD" -name allreduce_bench -type f -perm -u+x | head -1)
export PYTHONPATH=$BUILD/python${PYTHONPATH:+:$PYTHONPATH}
OUT=$(mktemp)
trap 'rm -f "$OUT"' EXIT

launch() { "$DDPRUN" --standalone --nproc-per-node $WORLD "$@" 2> >(grep -v OMP_NUM_THREADS >&2); }

{
  launch /usr/bin/python3 "$ROOT/bench/python/allreduce.py" ddp "$SIZES"
  launch /usr/bin/python3 "$ROOT/bench/python/allreduce.py" gloo "$SIZES"
  launch --no-python "$BIN" cpu --sizes "$SIZES"
  launch /usr/bin/python3 "$ROOT/bench/python/ddp_cnn.py" ddp "$STEPS"
  launch /usr/bin/python3 "$ROOT/bench/python/ddp_cnn.py" gloo "$STEPS"
} | tee "$OUT"

/usr/bin/python3 - "$OUT" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
ar = {(r["backend"], r["bytes"]): r for r in rows if r["bench"] == "allreduce"}
for nbytes in sorted({b for _, b in ar}):
    d, g, c = (ar.get((k, nbytes)) for k in ("torch-ddp", "torch-gloo", "cpu"))
    if not d:
        continue
    out = {"bench": "python_allreduce_summary", "bytes": nbytes, "ddp_us": d["us"],
           "ddp_busbw_gbps": d["busbw_gbps"]}
    if g:
        out["gloo_us"] = g["us"]
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
cnn = {r["backend"]: r for r in rows if r["bench"] == "ddp_cnn"}
if "ddp" in cnn and "gloo" in cnn:
    ratio = cnn["ddp"]["samples_per_s"] / cnn["gloo"]["samples_per_s"]
    print(json.dumps({"bench": "python_ddp_cnn_summary",
                      "ddp_samples_per_s": cnn["ddp"]["samples_per_s"],
                      "gloo_samples_per_s": cnn["gloo"]["samples_per_s"],
                      "ddp_over_gloo": round(ratio, 3), "target": "ddp >= gloo",
                      "meets_target": ratio >= 1.0}))
PY
