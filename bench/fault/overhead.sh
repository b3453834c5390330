#!/usr/bin/env bash
# What `--recovery step` costs when nothing fails (issue 26's "under 2% added to the CNN step
# without failures"): examples/mnist under ddprun with plain DDP (`ddp_plain`: --recovery
# group, the default) and with ddp::StepManager (`ddp_step`: ddprun --recovery step, mnist
# --recovery step), same CNN, batch and steps, no kill. Pairs alternate (plain, step, plain,
# step, ...) so a drift in the machine's load hits both.
#
#   bench/fault/overhead.sh [BUILD_DIR]       REPEAT=3 STEPS=400 WORLD=3
#
# JSON lines: one `fault` line per run (bench/fault/README.md's keys; no kill), then one
# `recovery_overhead` line: `step_s_plain`, `step_s_step` (medians over runs of each run's
# median step interval on rank 0), `overhead_pct` (step over plain, minus 1), `wall_s_plain`,
# `wall_s_step` (medians of whole runs: start, training, evaluation, exit), `steps_plain`,
# `steps_step` (rank 0's committed steps, must both be STEPS), `runs`, `load1_before`,
# `load1_after`, `target_under_2pct`.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
source "$root/bench/python.sh"  # PY
build=${1:-$root/build}
WORLD=${WORLD:-3}
STEPS=${STEPS:-400}
REPEAT=${REPEAT:-3}
# Enough epochs for STEPS (312 steps per epoch at 3 ranks x 64): plain mnist stops at the end
# of its last epoch even before --total-steps.
EPOCHS=$(( (STEPS + 60000 / WORLD / 64 - 1) / (60000 / WORLD / 64) ))
ddprun=$build/apps/ddprun/ddprun
mnist=$build/examples/mnist/mnist
for b in "$ddprun" "$mnist"; do
  [ -x "$b" ] || { echo "bench/fault/overhead.sh: $b not built (targets ddprun mnist)" >&2; exit 1; }
done
work=$(mktemp -d /tmp/ddp_bench_overhead_XXXXXX)
trap 'rm -rf "$work"' EXIT
out=$work/out.jsonl
load_before=$(cut -d' ' -f1 /proc/loadavg)
echo "bench/fault/overhead: $WORLD ranks, $STEPS steps, $REPEAT pairs; $(nproc) CPUs;" \
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
  esac
  "$PY" "$here/fault_driver.py" --system "$system" --log "$dir/loss.log" --kill-at 0 \
    --out "$dir/output.txt" -- "${cmd[@]}" | tee -a "$out"
}

for ((rep = 0; rep < REPEAT; rep++)); do
  run ddp_plain "$rep"
  run ddp_step "$rep"
done

"$PY" - "$out" "$load_before" "$(cut -d' ' -f1 /proc/loadavg)" <<'PYEOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
med = lambda xs: round(statistics.median(xs), 5) if xs else None
of = lambda system, key: [r[key] for r in rows if r["system"] == system and r.get(key)]
plain, step = med(of("ddp_plain", "step_s_median")), med(of("ddp_step", "step_s_median"))
pct = round((step / plain - 1) * 100, 2) if plain and step else None
print(json.dumps({"bench": "recovery_overhead", "runs": len(of("ddp_step", "wall_s")),
                  "step_s_plain": plain, "step_s_step": step, "overhead_pct": pct,
                  "wall_s_plain": med(of("ddp_plain", "wall_s")),
                  "wall_s_step": med(of("ddp_step", "wall_s")),
                  "steps_plain": sorted(set(of("ddp_plain", "last_step"))),
                  "steps_step": sorted(set(of("ddp_step", "last_step"))),
                  "all_exit_0": all(r["exit_code"] == 0 for r in rows),
                  "load1_before": float(sys.argv[2]), "load1_after": float(sys.argv[3]),
                  "target_under_2pct": pct is not None and pct < 2}), flush=True)
PYEOF
