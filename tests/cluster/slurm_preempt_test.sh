#!/usr/bin/env bash
# The real SLURM preemption test: deploy/slurm-venv.sbatch as users submit it runs
# examples/mnist (2 workers under ddprun, --checkpoint-dir) on a throw-away single-node cluster
# (slurm_harness.sh). Mid-epoch the job steps get SIGUSR1 from `scancel --signal=USR1` (what
# `#SBATCH --signal=USR1@N` sends before the time limit). Expected: both ranks stop after the
# same step N, ddprun exits 75, the template runs `scontrol requeue`, the requeued job prints
# "Resuming from .../step-N at step N" and finishes, and its loss log (appended by both runs)
# equals an uninterrupted run's line for line, bit for bit: no step lost or repeated.
#
# Usage: slurm_preempt_test.sh DDPRUN MNIST
# Exit 77 (skipped) with the reason when not root or SLURM/munge are absent; bounded waits.
set -euo pipefail

DDPRUN="${1:?usage: slurm_preempt_test.sh DDPRUN MNIST}"
MNIST="${2:?usage: slurm_preempt_test.sh DDPRUN MNIST}"
[[ -x "$DDPRUN" && -x "$MNIST" ]] || { echo "FAIL: $DDPRUN or $MNIST is not an executable"; exit 1; }
DDPRUN=$(realpath "$DDPRUN")
MNIST=$(realpath "$MNIST")
TEMPLATE="$(dirname "$(realpath "$0")")/../../deploy/slurm-venv.sbatch"
[[ -d /usr/share/datasets/fashion-mnist ]] ||
  { echo "SKIP: /usr/share/datasets/fashion-mnist absent (Debian package dataset-fashion-mnist)"; exit 77; }

SLURM_TEST_JOB_NAME=ddp-slurm-preempt
# A requeued job may start again once the first run's credential expired (SLURM: 120 s); the
# main scheduling loop then starts it within a second instead of a minute.
SLURM_TEST_CRED_EXPIRE=10
SLURM_TEST_EXTRA_CONF="SchedulerParameters=sched_interval=1"
# shellcheck source=slurm_harness.sh
source "$(dirname "$(realpath "$0")")/slurm_harness.sh"

# The signal comes after step 20 and the ranks agree to stop within a step or two of it; 200
# steps leave ~10 s of margin at the suite's load (a run of 600 cost ~30 CPU-s, 2 runs a test).
STEPS=200
# The losses are compared, not the accuracy: no evaluation after training (--test-images 0).
TRAIN="--epochs 1 --max-steps $STEPS --batch-size 16 --seed 5 --test-images 0"

# The reference: the same training, uninterrupted, outside SLURM.
# shellcheck disable=SC2086
(cd "$T" && timeout 300 "$DDPRUN" --standalone --nproc-per-node 2 "$MNIST" $TRAIN \
  --loss-log "$T/full.log" >"$T/full.out" 2>&1) || fail "the reference run failed: $(tail -n 20 "$T/full.out")"
[[ $(wc -l <"$T/full.log") -eq $STEPS ]] || fail "the reference run logged $(wc -l <"$T/full.log") steps"

# The time limit's own USR1 (--signal) is moved to the job's last 5 s, out of the test's way.
job_id=$(VENV="" DDPRUN="$DDPRUN" NPROC_PER_NODE=2 \
  PROGRAM="$MNIST $TRAIN --checkpoint-dir $T/ckpt --loss-log $T/loss.log" \
  timeout 30 sbatch --parsable --export=ALL --job-name="$SLURM_TEST_JOB_NAME" --nodes=1 \
  --gres=none --cpus-per-task=1 --time=4 --signal=USR1@5 --chdir="$T" --output="$T/job.out" \
  "$TEMPLATE") || fail "sbatch failed"
job_id=${job_id%%;*}
echo "job $job_id submitted"

job_field() { timeout 10 scontrol show job -o "$job_id" | tr ' ' '\n' | sed -n "s/^$1=//p"; }

# Preempt once rank 0 has logged 20 steps (bounded wait for a condition, not a timed check).
for _ in $(seq 1200); do
  [[ -f "$T/loss.log" && $(wc -l <"$T/loss.log") -ge 20 ]] && break
  state=$(job_field JobState)
  [[ "$state" == PENDING || "$state" == RUNNING || "$state" == CONFIGURING ]] ||
    fail "job $job_id is $state before it was preempted: $(cat "$T/job.out" 2>/dev/null)"
  sleep 0.1
done
[[ $(wc -l <"$T/loss.log") -ge 20 ]] || fail "the job logged no 20 steps within 120 s"
timeout 10 scancel --signal=USR1 "$job_id" || fail "scancel --signal=USR1 failed"
echo "job $job_id: SIGUSR1 sent to its steps after step $(wc -l <"$T/loss.log")"

# The template requeues the job; it runs again by itself and completes. Bounded waits.
for _ in $(seq 600); do
  [[ $(job_field Restarts) -ge 1 ]] && break
  sleep 0.2
done
[[ $(job_field Restarts) -ge 1 ]] ||
  fail "job $job_id was not requeued within 120 s: $(timeout 10 scontrol show job "$job_id"; cat "$T/job.out")"
state=""
for _ in $(seq 1200); do
  state=$(job_field JobState)
  case "$state" in
    COMPLETED) break ;;
    FAILED | CANCELLED | TIMEOUT | NODE_FAIL | OUT_OF_MEMORY | BOOT_FAIL | DEADLINE)
      fail "job $job_id ended $state after the requeue: $(timeout 10 scontrol show job "$job_id")" ;;
  esac
  sleep 0.2
done
[[ "$state" == COMPLETED ]] || fail "job $job_id did not complete within 240 s (state $state)"

echo "---- job output"; cat "$T/job.out"
out="$T/job.out"
[[ $(job_field Restarts) -ge 1 ]] || fail "job $job_id was not requeued (Restarts=$(job_field Restarts))"
step0=$(sed -n 's/.*rank 0: stop agreed after step \([0-9]*\).*/\1/p' "$out")
step1=$(sed -n 's/.*rank 1: stop agreed after step \([0-9]*\).*/\1/p' "$out")
[[ -n "$step0" && "$step0" == "$step1" ]] || fail "ranks stopped after steps '$step0' and '$step1'"
[[ $step0 -lt $STEPS ]] || fail "the stop came after the last step"
grep -q "requeueing the job" "$out" || fail "the template did not requeue"
grep -q "restart 1" "$out" || fail "no second run of the batch script"
grep -q "Resuming from $T/ckpt/step-$(printf %08d "$step0") at step $step0" "$out" ||
  fail "the requeued job did not resume at step $step0"
cmp -s "$T/loss.log" "$T/full.log" ||
  fail "losses differ from the uninterrupted run's: $(diff "$T/loss.log" "$T/full.log" | head)"
echo "PASS: job $job_id preempted after step $step0 on both ranks, requeued, resumed there;" \
  "$STEPS losses equal the uninterrupted run's (no step lost or repeated)"
