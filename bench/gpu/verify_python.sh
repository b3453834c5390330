#!/usr/bin/env bash
# The Python side of the GPU verification (called by verify.sh; usable alone):
#   ddp's Python backend with CUDA tensors (python_cuda.py, world 1 and 2 on GPU 0),
#   a PyTorch tutorial's GPU script (seed 000's multi_gpu.py) under ddprun, unmodified, twice
#   (the second run resumes from its snapshot), and Accelerate and Lightning on the GPU under
#   ddprun (tests/frameworks/).
#
#   PYTHON=python3 DDPRUN=build/apps/ddprun DDP_PYTHONPATH=build/python SEEDS=../shared/seeds \
#     [PARTS="cuda tutorial frameworks"] bench/gpu/verify_python.sh OUT_DIR
#
# Prints JSON lines (the scripts' own, and {"bench": "gpu_verify", "step": "python", ...} status
# lines); logs go to OUT_DIR/logs/python-*.log.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT_DIR=${1:?usage: verify_python.sh OUT_DIR}
PYTHON=${PYTHON:-python3}
DDPRUN=${DDPRUN:?set DDPRUN to the ddprun executable}
SEEDS=${SEEDS:-$ROOT/../shared/seeds}
LOGS=$OUT_DIR/logs
mkdir -p "$LOGS"
export PYTHONPATH=${DDP_PYTHONPATH:+$DDP_PYTHONPATH:}${PYTHONPATH:-}
# ddprun runs .py files with the first python3 on PATH: make it PYTHON's.
export DDPRUN_PYTHON=$(command -v "$PYTHON")
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1

status() {  # what ok|failed detail
  "$PYTHON" -c 'import json,sys; print(json.dumps({"bench": "gpu_verify", "step": "python", "what": sys.argv[1], "status": sys.argv[2], "detail": sys.argv[3][-600:]}))' "$@"
}
json_lines() { grep -a --line-buffered '^{' || true; }
# PARTS (default all three): cuda tutorial frameworks.
part() { [[ " ${PARTS:-cuda tutorial frameworks} " == *" $1 "* ]]; }

# 1. The Python backend and CUDA tensors.
for world in 1 2; do
  part cuda || break
  timeout 150 "$DDPRUN" --standalone --nproc-per-node $world "$ROOT/bench/gpu/python_cuda.py" \
    >"$LOGS/python-cuda-w$world.log" 2>&1
  rc=$?
  json_lines <"$LOGS/python-cuda-w$world.log"
  status "python_cuda world $world" "$([ $rc = 0 ] && echo ok || echo failed)" \
    "exit $rc; $(grep -a -v '^{' "$LOGS/python-cuda-w$world.log" | tail -3 | tr '\n' ' ')"
done

# 2. A tutorial's GPU script, unmodified, under ddprun (1 rank: NCCL takes one rank per GPU).
seed=$(ls "$SEEDS"/000_*.txt 2>/dev/null | head -1)
if ! part tutorial; then
  :
elif [ -n "$seed" ]; then
  work=$(mktemp -d)
  "$PYTHON" "$ROOT/bench/gpu/seed_code.py" "$seed" multi_gpu.py datautils.py --out "$work"
  for run in first resumed; do
    (cd "$work" && timeout 300 "$DDPRUN" --standalone --nproc-per-node 1 multi_gpu.py 3 1) \
      >"$LOGS/python-tutorial-$run.log" 2>&1
    rc=$?
    want="Training snapshot saved"
    [ $run = resumed ] && want="Resuming training from snapshot"
    if [ $rc = 0 ] && grep -aq "$want" "$LOGS/python-tutorial-$run.log"; then
      status "tutorial 000 multi_gpu.py ($run)" ok "$(grep -a "$want" "$LOGS/python-tutorial-$run.log" | head -1)"
    else
      status "tutorial 000 multi_gpu.py ($run)" failed "exit $rc; $(tail -3 "$LOGS/python-tutorial-$run.log" | tr '\n' ' ')"
    fi
  done
else
  status "tutorial 000 multi_gpu.py" skipped "no seed 000 in $SEEDS (SEEDS)"
fi

# 3. Accelerate and Lightning on the GPU under ddprun.
for fw in accelerate lightning; do
  part frameworks || break
  timeout 300 "$DDPRUN" --standalone --nproc-per-node 1 "$ROOT/tests/frameworks/${fw}_train.py" \
    >"$LOGS/python-$fw.log" 2>&1
  rc=$?
  json_lines <"$LOGS/python-$fw.log"
  status "$fw under ddprun on the GPU" "$([ $rc = 0 ] && echo ok || echo failed)" \
    "exit $rc; $(grep -a -v '^{' "$LOGS/python-$fw.log" | tail -3 | tr '\n' ' ')"
done
