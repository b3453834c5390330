#!/bin/bash
# Horovod's synthetic PyTorch benchmark pattern (synthetic.py) at 2 ranks under ddprun, in one
# run: ddp's Horovod layer on ddp's backend and on PyTorch's gloo, and PyTorch DDP on gloo, the
# same model, data and optimizer; real Horovod too when HOROVOD_PYTHON names an interpreter
# whose `import horovod.torch` works (README.md says why it is absent here). Rounds alternate
# the order. Prints each run's JSON line, then a `horovod_summary` line: medians over rounds of
# images/s per rank and the ratios against PyTorch DDP (above 1: faster), with the load.
#   bench/horovod/run.sh [BUILD_DIR] [ROUNDS] [RANKS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../python.sh"  # PY: the interpreter with PyTorch 2.13
build=${1:-$here/../../build}
rounds=${2:-3}
ranks=${3:-2}
ddprun=$build/apps/ddprun/ddprun
[ -x "$ddprun" ] || { echo "bench/horovod/run.sh: $ddprun not built" >&2; exit 1; }
layer=$(PYTHONPATH=$build/python "$PY" -m ddp.horovod)
out=$(mktemp)
trap 'rm -f "$out"' EXIT

run() {  # run PYTHON PYTHONPATH [ENV=V...] -- ARGS...
  local py=$1 path=$2; shift 2
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  env PYTHONPATH="$path" "${envs[@]}" "$ddprun" --standalone --nproc-per-node "$ranks" \
    "$py" -W ignore "$here/synthetic.py" "$@" 2>/dev/null | grep '^{' | tee -a "$out"
}

for ((i = 0; i < rounds; i++)); do
  configs=(layer_ddp layer_gloo torch_ddp)
  [ -n "${HOROVOD_PYTHON:-}" ] && configs+=(horovod)
  ((i % 2)) && configs=($(printf '%s\n' "${configs[@]}" | tac))
  for c in "${configs[@]}"; do
    case $c in
      layer_ddp) run "$PY" "$layer" -- --impl hvd ;;
      layer_gloo) run "$PY" "$layer" HOROVOD_DDP_BACKEND=gloo -- --impl hvd ;;
      torch_ddp) run "$PY" "$build/python" -- --impl torch-ddp ;;
      horovod) run "$HOROVOD_PYTHON" "" -- --impl hvd ;;
    esac
  done
done

"$PY" - "$out" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
def key(r):
    return r["impl"] + ("/" + r["backend"] if r["impl"] == "ddp-horovod-layer" else "")
by = {}
for r in rows:
    by.setdefault(key(r), []).append(r["img_per_s_per_rank"])
med = {k: statistics.median(v) for k, v in by.items()}
ref = med.get("torch-ddp")
print(json.dumps({"bench": "horovod_summary", "ranks": rows[0]["ranks"] if rows else 0,
                  "img_per_s_per_rank_median": med,
                  "ratio_vs_torch_ddp_gloo": {k: round(v / ref, 3) for k, v in med.items()}
                  if ref else {},
                  "rounds": len(by.get("torch-ddp", [])),
                  "loadavg_1m": [r["loadavg_1m"] for r in rows]}))
PYEOF
