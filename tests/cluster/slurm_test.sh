#!/usr/bin/env bash
# A real single-node SLURM cluster: munged, slurmctld and slurmd started from a throw-away
# config under a temp dir (non-default free ports), one `sbatch --wait` job whose srun runs
# ddp-detect on 2 tasks (and ddprun with 2 workers when it is built). Checks what the tasks
# printed, then ALWAYS stops the daemons and removes the temp dir.
#
# Usage: slurm_test.sh DDP_DETECT [DDPRUN]
# Exit 77 (ctest: skipped) with the reason when not root or the slurm/munge binaries are
# absent (scripts/install-deps.sh test installs slurm-wlm and munge). Bounded: every wait
# has a limit, the whole test takes well under 90 s.
set -euo pipefail

DETECT="${1:?usage: slurm_test.sh DDP_DETECT [DDPRUN]}"
DDPRUN="${2:-}"

[[ -x "$DETECT" ]] || { echo "FAIL: $DETECT is not an executable"; exit 1; }
DETECT=$(realpath "$DETECT")  # slurmstepd starts tasks in the job's directory
[[ -n "$DDPRUN" && -x "$DDPRUN" ]] && DDPRUN=$(realpath "$DDPRUN") || DDPRUN=""

# shellcheck source=slurm_harness.sh
source "$(dirname "$(realpath "$0")")/slurm_harness.sh"

cat > "$T/job.sh" <<JOB
#!/bin/bash
echo "batch SLURM_JOB_ID=\$SLURM_JOB_ID"
srun --ntasks=2 "$DETECT"
srun --ntasks=2 bash -c 'echo "task SLURM_PROCID=\$SLURM_PROCID SLURM_NODEID=\$SLURM_NODEID"'
if [[ -n "$DDPRUN" ]]; then
  srun --ntasks=1 "$DDPRUN" --standalone --nproc-per-node 2 \
    /bin/sh -c 'echo "worker RANK=\$RANK WORLD_SIZE=\$WORLD_SIZE"'
fi
JOB
chmod +x "$T/job.sh"

timeout 60 sbatch --wait --job-name=ddp-slurm-test --nodes=1 --ntasks=2 --time=2 \
  --chdir="$T" --output="$T/job.out" "$T/job.sh" >"$T/sbatch.out" 2>&1 ||
  fail "sbatch --wait failed or took over 60 s: $(cat "$T/sbatch.out")"

out="$T/job.out"
echo "---- job output"; cat "$out"
job_id=$(sed -n 's/^batch SLURM_JOB_ID=//p' "$out")
[[ -n "$job_id" ]] || fail "the batch script printed no SLURM_JOB_ID"
[[ $(grep -c '"source":"slurm"' "$out") -eq 2 ]] || fail "expected 2 tasks detecting SLURM"
grep -q "\"run_id\":\"$job_id\"" "$out" || fail "run id is not the job id $job_id"
grep -q "\"master_addr\":\"$HOST\"" "$out" || fail "master is not $HOST"
grep -q '"nnodes":1,"node_rank":0' "$out" || fail "expected nnodes 1, node rank 0"
grep -q "using SLURM: job $job_id, 1 node $HOST, this is node 0, master $HOST" "$out" ||
  fail "explanation line missing"
grep -q 'srun started 2 tasks on this node' "$out" || fail "no warning about 2 tasks per node"
grep -q 'task SLURM_PROCID=0 SLURM_NODEID=0' "$out" || fail "task 0 missing"
grep -q 'task SLURM_PROCID=1 SLURM_NODEID=0' "$out" || fail "task 1 missing"
if [[ -n "$DDPRUN" ]]; then
  grep -q 'RANK=0 WORLD_SIZE=2' "$out" || fail "ddprun worker 0 missing"
  grep -q 'RANK=1 WORLD_SIZE=2' "$out" || fail "ddprun worker 1 missing"
fi
echo "PASS: SLURM job $job_id ran detection on 2 tasks"

# The deploy template as users submit it; the test cluster has 2 CPUs, no GPUs and a 5-minute
# limit, so those requests are overridden on the command line.
if [[ -n "$DDPRUN" ]]; then
  TEMPLATE="$(dirname "$(realpath "$0")")/../../deploy/slurm-venv.sbatch"
  printf '#!/bin/sh\necho "template worker RANK=$RANK WORLD_SIZE=$WORLD_SIZE"\n' >"$T/worker.sh"
  chmod +x "$T/worker.sh"
  VENV="" DDPRUN="$DDPRUN" NPROC_PER_NODE=2 PROGRAM="$T/worker.sh" \
    timeout 60 sbatch --wait --export=ALL --job-name=ddp-slurm-test --nodes=1 --gres=none --cpus-per-task=1 --time=2 \
    --chdir="$T" --output="$T/template.out" "$TEMPLATE" >"$T/sbatch2.out" 2>&1 ||
    fail "the deploy template job failed: $(cat "$T/sbatch2.out"; cat "$T/template.out" 2>/dev/null)"
  echo "---- template job output"; cat "$T/template.out"
  grep -q 'template worker RANK=0 WORLD_SIZE=2' "$T/template.out" || fail "template worker 0 missing"
  grep -q 'template worker RANK=1 WORLD_SIZE=2' "$T/template.out" || fail "template worker 1 missing"
  echo "PASS: deploy/slurm-venv.sbatch ran 2 workers under ddprun"
fi
