#!/usr/bin/env bash
# What `--recovery step` costs when nothing fails (issue 26's "under 2% added to the CNN step
# without failures"): examples/mnist under ddprun with plain DDP (`ddp_plain`: --recovery
# group, the default) and with ddp::StepManager (`ddp_step`: ddprun --recovery step, mnist
# --recovery step), same CNN, batch and steps, no kill. Pairs alternate (plain, step, plain,
# step, ...) so a drift in the machine's load hits both.
#
#   bench/fault/overhead.sh [BUILD_DIR]       REPEAT=3 STEPS=400 WORLD=3 PAIR=cpp
#
# PAIR=python_gloo (issue 48's "failure-free overhead of StepManager on that script"): the
# Python script of bench/fault (fault_train.py: PyTorch's DistributedDataParallel on PyTorch's
# gloo, the same CNN and batches) as the tutorial writes it (`python_gloo_plain`: its torchrun
# recipe, snapshot after every epoch) against the same with ddp.StepManager
# (`python_gloo_step`: ddprun --recovery step), both launched by ddprun, whole epochs
# (STEPS rounded up to them).
#
# JSON lines: one `fault` line per run (bench/fault/README.md's keys; no kill), then one
# `recovery_overhead` line: `step_s_plain`, `step_s_step` (medians over runs of each run's
# median step interval on rank 0), `overhead_pct` (step over plain, minus 1), `wall_s_plain`,
# `wall_s_step` (medians of whole runs: start, training, evaluation, exit), `cpu_s_plain`,
# `cpu_s_step`, `cpu_overhead_pct` (the same for rank 0's CPU seconds per step, PAIR=python_gloo
# only; on this project's 2-core machine they swing as much as wall time: bench/fault/README.md),
# `steps_plain`,
# `steps_step` (rank 0's committed steps, must both be STEPS), `runs`, `load1_before`,
# `load1_after`, `target_under_2pct`, `pair`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/bench/python.sh"  # PY
build=${1:-$root/build}
WORLD=${WORLD:-3}
STEPS=${STEPS:-400}
REPEAT=${REPEAT:-3}
PAIR=${PAIR:-cpp}
case $PAIR in
  cpp) systems=(ddp_plain ddp_step) ;;
  python_gloo) systems=(python_gloo_plain python_gloo_step) ;;
  *) echo "bench/fault/overhead.sh: PAIR=$PAIR: expected cpp or python_gloo" >&2; exit 2 ;;
esac
# Enough epochs for STEPS (312 steps per epoch at 3 ranks x 64): plain mnist stops at the end
# of its last epoch even before --total-steps.
steps_per_epoch=$((60000 / WORLD / 64))
EPOCHS=$(( (STEPS + steps_per_epoch - 1) / steps_per_epoch ))
ddprun=$build/apps/ddprun/ddprun
mnist=$build/examples/mnist/mnist
for b in "$ddprun" "$mnist"; do
  [ -x "$b" ] || { echo "bench/fault/overhead.sh: $b not built (targets ddprun mnist)" >&2; exit 1; }
done
work=$(mktemp -d /tmp/ddp_bench_overhead_XXXXXX)
trap 'rm -rf "$work"' EXIT
out=$work/out.jsonl
load_before=$(cut -d' ' -f1 /proc/loadavg)
# The tutorial's recipe trains whole epochs: the Python pair runs those.
[[ $PAIR == python_gloo ]] && STEPS=$((EPOCHS * steps_per_epoch))
echo "bench/fault/overhead: $PAIR, $WORLD ranks, $STEPS steps, $REPEAT pairs; $(nproc) CPUs;" \
  "uptime: $(uptime)" >&2

run() {
  local system=$1 rep=$2 cmd
  local dir=$work/$system-$rep
  mkdir -p "$dir"
  case $system in
    ddp_plain)
      cmd=("$ddprun" --standalone --nproc-per-node "$WORLD" "$mnist" --batch-size 64 --epochs "$EPOCHS"
           --total-steps "$STEPS" --loss-log "$dir/loss.log") ;;
    ddp_step)
      cmd=("$ddprun" --standalone --nproc-per-node "$WORLD" --recovery step "$mnist"
           --recovery step --batch-size 64 --epochs "$EPOCHS" --total-steps "$STEPS"
           --loss-log "$dir/loss.log") ;;
    python_gloo_plain)
      cmd=("$ddprun" --standalone --nproc-per-node "$WORLD" --no-python "$PY"
           "$here/fault_train.py" torchrun --epochs "$EPOCHS" --save-every 1
           --snapshot "$dir/snapshot.pt" --loss-log "$dir/loss.log") ;;
    python_gloo_step)
      cmd=("$ddprun" --standalone --nproc-per-node "$WORLD" --recovery step --no-python env
           "PYTHONPATH=$build/python${PYTHONPATH:+:$PYTHONPATH}" "$PY" "$here/fault_train.py"
           ddp_step --backend gloo --total-steps "$STEPS" --loss-log "$dir/loss.log") ;;
  esac
  "$PY" "$here/fault_driver.py" --system "$system" --log "$dir/loss.log" --kill-at 0 \
    --out "$dir/output.txt" -- "${cmd[@]}" | tee -a "$out"
}

for ((rep = 0; rep < REPEAT; rep++)); do
  run "${systems[0]}" "$rep"
  run "${systems[1]}" "$rep"
done

"$PY" - "$out" "$load_before" "$(cut -d' ' -f1 /proc/loadavg)" "$PAIR" "${systems[@]}" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
pair, plain_system, step_system = sys.argv[4:7]
med = lambda xs: round(statistics.median(xs), 5) if xs else None
of = lambda system, key: [r[key] for r in rows if r["system"] == system and r.get(key)]
plain, step = med(of(plain_system, "step_s_median")), med(of(step_system, "step_s_median"))
pct = round((step / plain - 1) * 100, 2) if plain and step else None
cpu_plain = med(of(plain_system, "cpu_s_per_step_median"))
cpu_step = med(of(step_system, "cpu_s_per_step_median"))
cpu_pct = round((cpu_step / cpu_plain - 1) * 100, 2) if cpu_plain and cpu_step else None
print(json.dumps({"bench": "recovery_overhead", "pair": pair,
                  "runs": len(of(step_system, "wall_s")),
                  "step_s_plain": plain, "step_s_step": step, "overhead_pct": pct,
                  "cpu_s_plain": cpu_plain, "cpu_s_step": cpu_step, "cpu_overhead_pct": cpu_pct,
                  "wall_s_plain": med(of(plain_system, "wall_s")),
                  "wall_s_step": med(of(step_system, "wall_s")),
                  "steps_plain": sorted(set(of(plain_system, "last_step"))),
                  "steps_step": sorted(set(of(step_system, "last_step"))),
                  "all_exit_0": all(r["exit_code"] == 0 for r in rows),
                  "load1_before": float(sys.argv[2]), "load1_after": float(sys.argv[3]),
                  "target_under_2pct": pct is not None and pct < 2}), flush=True)
PYEOF
