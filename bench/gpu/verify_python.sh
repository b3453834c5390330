#!/usr/bin/env bash
# The Python side of the GPU verification (called by verify.sh; usable alone):
#   cuda        ddp's Python backend with CUDA tensors (python_cuda.py, world 1 and 2 on GPU 0)
#   tutorial    the PyTorch tutorials' scripts under ddprun, 1 rank, unmodified: seed 000's
#               multi_gpu.py (nccl, cuda) twice (the second run resumes from its snapshot), then
#               once more under --recovery step (no StepManager: it must run as usual); seed 004's
#               cnn_cpu.py and cnn_gpu.py (below), each plain and under --recovery step
#   frameworks  Accelerate and Lightning on the GPU under ddprun (tests/frameworks/)
#   reform      ddp.StepManager on PyTorch's nccl, cuda:0, 1 rank under ddprun --recovery step,
#               through REFORMS (default 20) forced re-forms (python_nccl_reform.py); then the
#               same on the ddp backend (its CUDA tensors on its NCCL lane)
#
#   PYTHON=python3 DDPRUN=build/apps/ddprun DDP_PYTHONPATH=build/python SEEDS=../shared/seeds \
#     [PARTS="cuda tutorial frameworks reform"] bench/gpu/verify_python.sh OUT_DIR
#
# Without a GPU (a smoke test of this script): PARTS="tutorial reform" PYTHON_NCCL_BACKEND="gloo ddp"
# PYTHON_NCCL_DEVICE=cpu; seed 000's script needs CUDA and is then skipped, 004's run on the CPU.
#
# Seed 004 (t04_scaling_python_workloads) has one complete script, cnn_cpu.py (section 4.6.1,
# extracted by its heading); its GPU scripts are given only as fragments and a link. So
# cnn_gpu.py here is cnn_cpu.py with the edits its section 4.6.2 shows (the device chosen by
# torch.cuda.is_available(), model.to(device), data and target .to(device)), applied below by
# exact text substitution. Both import CNN_classifier from a model.py the tutorial does not
# include: a small stand-in CNN (log-probabilities, as its NLLLoss needs) is written beside them.
# They take MNIST through torchvision with download=True: the machine has no internet, so the
# data is put where torchvision looks first (./data/MNIST/raw/, unpacked IDX files): Fashion-MNIST,
# the same format (FASHION_MNIST_DIR, else SEEDS/../fashion-mnist as pack_deps.sh packs it, else
# /usr/share/datasets/fashion-mnist). Without torchvision in PYTHON, the wheels pack_deps.sh
# packed with WHEELS_PYTHON (SEEDS/../wheels) are installed into a temporary folder; without
# those either, 004 is skipped. TUTORIAL_004_ARGS: the scripts' arguments (default
# "--batch_size 512 --epochs 1 --lr 0.001": 118 steps).
#
# Prints JSON lines (the scripts' own, and {"bench": "gpu_verify", "step": "python", ...} status
# lines); logs go to OUT_DIR/logs/python-*.log.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT_DIR=${1:?usage: verify_python.sh OUT_DIR}
PYTHON=${PYTHON:-python3}
DDPRUN=${DDPRUN:?set DDPRUN to the ddprun executable}
# Absolute: the tutorials run in folders of their own.
[[ $DDPRUN == */* ]] && DDPRUN=$(cd "$(dirname "$DDPRUN")" && pwd)/$(basename "$DDPRUN")
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
# PARTS (default all four): cuda tutorial frameworks reform.
part() { [[ " ${PARTS:-cuda tutorial frameworks reform} " == *" $1 "* ]]; }
have_cuda=$("$PYTHON" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
# ddprun's own lines of a log (what it said about the run), on one line.
ddprun_says() { local s; s=$(grep -a '^ddprun' "$1" | tr '\n' ' ' | cut -c1-400); echo "${s:-(nothing)}"; }

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
elif [ -z "$seed" ]; then
  status "tutorial 000 multi_gpu.py" skipped "no seed 000 in $SEEDS (SEEDS)"
elif [ "$have_cuda" != 1 ]; then
  status "tutorial 000 multi_gpu.py" skipped "no CUDA in $PYTHON: the script hard-codes nccl and cuda"
else
  work=$(mktemp -d)
  "$PYTHON" "$ROOT/bench/gpu/seed_code.py" "$seed" multi_gpu.py datautils.py --out "$work"
  # first, resumed (from first's snapshot), then --recovery step in a folder of its own.
  for run in first resumed recovery-step; do
    flags=() dir=$work
    [ $run = recovery-step ] && flags=(--recovery step) && dir=$work/step && mkdir -p "$dir" &&
      cp "$work"/*.py "$dir"/
    log=$LOGS/python-tutorial-$run.log
    (cd "$dir" && timeout 300 "$DDPRUN" --standalone --nproc-per-node 1 "${flags[@]}" \
      multi_gpu.py 3 1) >"$log" 2>&1
    rc=$?
    want="Training snapshot saved"
    [ $run = resumed ] && want="Resuming training from snapshot"
    if [ $rc = 0 ] && grep -aq "$want" "$log"; then
      status "tutorial 000 multi_gpu.py ($run)" ok \
        "$(grep -a "$want" "$log" | head -1); ddprun: $(ddprun_says "$log")"
    else
      status "tutorial 000 multi_gpu.py ($run)" failed "exit $rc; $(tail -3 "$log" | tr '\n' ' ')"
    fi
  done
fi

# Seed 004's cnn_cpu.py, and cnn_gpu.py made from it (see the top), plain and --recovery step.
seed=$(ls "$SEEDS"/004_*.txt 2>/dev/null | head -1)
idx=${FASHION_MNIST_DIR:-}
for d in "$SEEDS/../fashion-mnist" "$ROOT/.gpu-deps/fashion-mnist" /usr/share/datasets/fashion-mnist; do
  [ -z "$idx" ] && [ -f "$d/train-images-idx3-ubyte.gz" ] && idx=$d
done
if ! part tutorial; then
  :
elif [ -z "$seed" ]; then
  status "tutorial 004" skipped "no seed 004 in $SEEDS (SEEDS)"
elif [ -z "$idx" ]; then
  status "tutorial 004" skipped "no MNIST-format data (FASHION_MNIST_DIR): the scripts download MNIST, and this machine has no internet"
else
  work=$(mktemp -d)
  tv_path=
  if ! "$PYTHON" -c 'import torchvision' >/dev/null 2>&1; then
    wheels=$(ls "$SEEDS"/../wheels/*.whl 2>/dev/null)
    if [ -n "$wheels" ] && "$PYTHON" -m pip install -q --no-deps --no-index --target "$work/site" \
        $wheels >"$LOGS/python-tutorial-004-wheels.log" 2>&1; then
      tv_path=$work/site
    fi
  fi
  if ! PYTHONPATH=${tv_path:+$tv_path:}$PYTHONPATH "$PYTHON" -c 'import torchvision' \
      >"$LOGS/python-tutorial-004-torchvision.log" 2>&1; then
    status "tutorial 004" skipped "$PYTHON has no torchvision (its scripts import it)$([ -n "$tv_path" ] && echo ', not even with the wheels of SEEDS/../wheels' || echo '; pack_deps.sh with WHEELS_PYTHON packs wheels'): $(tail -1 "$LOGS/python-tutorial-004-torchvision.log")"
  elif ! "$PYTHON" "$ROOT/bench/gpu/seed_code.py" "$seed" 'cnn_cpu.py@### 4.6.1.' --out "$work" \
      >"$LOGS/python-tutorial-004-extract.log" 2>&1; then
    status "tutorial 004 cnn_cpu.py" failed "extraction: $(tail -1 "$LOGS/python-tutorial-004-extract.log")"
  else
    mkdir -p "$work/data/MNIST/raw"
    for f in "$idx"/*-ubyte.gz; do gzip -dc "$f" >"$work/data/MNIST/raw/$(basename "$f" .gz)"; done
    cat >"$work/model.py" <<'PY'
# A stand-in for tutorial 004's model.py (not in the tutorial): a small CNN for 1x28x28 images
# whose output is log-probabilities, as the tutorial's NLLLoss needs.
import torch.nn as nn


class CNN_classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(32 * 7 * 7, 128), nn.ReLU(),
                                  nn.Linear(128, 10), nn.LogSoftmax(dim=1))

    def forward(self, x):
        return self.head(self.features(x))
PY
    # cnn_gpu.py: the edits of section 4.6.2, each on text that occurs exactly once.
    "$PYTHON" - "$work/cnn_cpu.py" "$work/cnn_gpu.py" <<'PY' >"$LOGS/python-tutorial-004-derive.log" 2>&1
import sys
src = open(sys.argv[1]).read()
edits = [
    ("def train(model, dataloader: DataLoader, args):",
     "def train(model, dataloader: DataLoader, args, device):"),
    ("            output = model(data)\n",
     "            data = data.to(device)\n            target = target.to(device)\n"
     "            output = model(data)\n"),
    ("    model = CNN_classifier()\n",
     "    if torch.cuda.is_available():\n        print(\"Utilizing GPU\")\n"
     "        device = torch.device(\"cuda\")\n    else:\n        print(\"Utilizing CPU\")\n"
     "        device = torch.device('cpu')\n    model = CNN_classifier()\n    model.to(device)\n"),
    ("train(model=model, dataloader= train_loader, args=args)",
     "train(model=model, dataloader= train_loader, args=args, device=device)"),
]
for old, new in edits:
    if src.count(old) != 1:
        sys.exit(f"cnn_gpu.py: {old!r} occurs {src.count(old)} times in cnn_cpu.py, not once")
    src = src.replace(old, new)
open(sys.argv[2], "w").write(src)
PY
    derive_rc=$?
    read -r -a args004 <<<"${TUTORIAL_004_ARGS:---batch_size 512 --epochs 1 --lr 0.001}"
    for script in cnn_cpu.py cnn_gpu.py; do
      if [ $script = cnn_gpu.py ] && [ $derive_rc != 0 ]; then
        status "tutorial 004 cnn_gpu.py" failed "made from cnn_cpu.py: $(tail -1 "$LOGS/python-tutorial-004-derive.log")"
        continue
      fi
      for run in plain recovery-step; do
        flags=()
        [ $run = recovery-step ] && flags=(--recovery step)
        log=$LOGS/python-tutorial-004-${script%.py}-$run.log
        (cd "$work" && PYTHONPATH=${tv_path:+$tv_path:}$PYTHONPATH timeout 300 "$DDPRUN" \
          --standalone --nproc-per-node 1 "${flags[@]}" $script "${args004[@]}") >"$log" 2>&1
        rc=$?
        want="Exiting training loop"
        [ $script = cnn_gpu.py ] && [ "$have_cuda" = 1 ] && ! grep -aq "Utilizing GPU" "$log" &&
          want="Utilizing GPU"
        if [ $rc = 0 ] && grep -aq "$want" "$log" && grep -aq "Training time" "$log"; then
          status "tutorial 004 $script ($run)" ok "$(grep -a -m1 'Utilizing' "$log" | sed 's/$/; /')$(grep -a 'Loss:' "$log" | tail -1 | tr '\t' ' '); $(grep -a 'Training time' "$log"); ddprun: $(ddprun_says "$log")"
        else
          status "tutorial 004 $script ($run)" failed "exit $rc; want '$want'; $(tail -3 "$log" | tr '\n' ' ')"
        fi
      done
    done
  fi
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

# 4. ddp.StepManager on PyTorch's nccl (cuda:0), 1 rank, through forced re-forms; then on the
#    ddp backend, whose CUDA tensors run on its NCCL lane (re-made in every generation).
for backend in ${PYTHON_NCCL_BACKEND:-nccl ddp}; do
  part reform || break
  device=${PYTHON_NCCL_DEVICE:-cuda:0}
  log=$LOGS/python-reform-$backend.log
  PYTHON_NCCL_BACKEND=$backend PYTHON_NCCL_DEVICE=$device timeout 300 "$DDPRUN" --standalone \
    --nproc-per-node 1 --recovery step "$ROOT/bench/gpu/python_nccl_reform.py" \
    --reforms "${REFORMS:-20}" >"$log" 2>&1
  rc=$?
  json_lines <"$log"
  if [ $rc = 0 ] && grep -aq '"bench": "gpu_python_reform".*"ok": true' "$log"; then
    status "StepManager re-forms on $backend ($device)" ok "$(grep -a '"gpu_python_reform"' "$log" | tail -1 | cut -c1-500)"
  else
    status "StepManager re-forms on $backend ($device)" failed \
      "exit $rc$([ $rc = 124 ] && echo ' (timeout 300 s)'); $(grep -a 'FAILED\|Error' "$log" | head -4 | tr '\n' ' ') $(grep -a -v '^{' "$log" | tail -2 | tr '\n' ' ')"
  fi
done
