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

skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root (slurmd runs jobs as root with SlurmUser=root)"
for tool in munged slurmctld slurmd sbatch srun sinfo scontrol; do
  command -v "$tool" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin"
  command -v "$tool" >/dev/null 2>&1 || skip "$tool not found (Debian packages slurm-wlm and munge)"
done
[[ -x "$DETECT" ]] || { echo "FAIL: $DETECT is not an executable"; exit 1; }
DETECT=$(realpath "$DETECT")  # slurmstepd starts tasks in the job's directory
[[ -n "$DDPRUN" && -x "$DDPRUN" ]] && DDPRUN=$(realpath "$DDPRUN") || DDPRUN=""

T=$(mktemp -d /tmp/ddp-slurm-XXXXXX)
chmod 755 "$T"
PIDS=()
cleanup() {
  local rc=$?
  if [[ -f "$T/slurm.conf" ]]; then
    SLURM_CONF="$T/slurm.conf" timeout 5 scancel --quiet --full "--name=ddp-slurm-test" 2>/dev/null || true
  fi
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  if [[ $rc -ne 0 && $rc -ne 77 ]]; then
    for log in slurmctld.log slurmd.log munged.log job.out; do
      [[ -f "$T/$log" ]] && { echo "---- $log (last 30 lines)"; tail -n 30 "$T/$log"; }
    done
  fi
  rm -rf "$T"
  exit $rc
}
trap cleanup EXIT INT TERM

fail() { echo "FAIL: $*"; exit 1; }

# Free ports: bind port 0 and read what the kernel chose.
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
CTLD_PORT=$(free_port)
SLURMD_PORT=$(free_port)
while [[ "$SLURMD_PORT" == "$CTLD_PORT" ]]; do SLURMD_PORT=$(free_port); done

# munge: its own key, socket and files, so a system munged (if any) is left alone.
dd if=/dev/urandom of="$T/munge.key" bs=1024 count=1 status=none
chmod 400 "$T/munge.key"
munged --force --socket="$T/munge.sock" --key-file="$T/munge.key" --pid-file="$T/munged.pid" \
  --log-file="$T/munged.log" --seed-file="$T/munged.seed" -F >"$T/munged.out" 2>&1 &
PIDS+=($!)
for _ in $(seq 50); do [[ -S "$T/munge.sock" ]] && break; sleep 0.1; done
[[ -S "$T/munge.sock" ]] || fail "munged did not create its socket within 5 s"

HOST=$(hostname -s)
NODE_LINE=$(slurmd -C | head -n 1)  # "NodeName=host CPUs=... RealMemory=..."
mkdir -p "$T/state" "$T/spool"
cat > "$T/slurm.conf" <<CONF
ClusterName=ddptest
SlurmctldHost=$HOST
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$T/munge.sock
StateSaveLocation=$T/state
SlurmdSpoolDir=$T/spool
SlurmctldPidFile=$T/slurmctld.pid
SlurmdPidFile=$T/slurmd.pid
SlurmctldLogFile=$T/slurmctld.log
SlurmdLogFile=$T/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
SlurmctldTimeout=30
SlurmdTimeout=30
$NODE_LINE State=UNKNOWN
PartitionName=ddptest Nodes=$HOST Default=YES MaxTime=5 State=UP
CONF
export SLURM_CONF="$T/slurm.conf"

slurmctld -D -i -f "$SLURM_CONF" >"$T/slurmctld.out" 2>&1 &
PIDS+=($!)
slurmd -D -f "$SLURM_CONF" >"$T/slurmd.out" 2>&1 &
PIDS+=($!)

state=""
for _ in $(seq 150); do
  state=$(timeout 5 sinfo -h -o %t 2>/dev/null || true)
  [[ "$state" == "idle" ]] && break
  sleep 0.2
done
[[ "$state" == "idle" ]] || fail "the node did not become idle within 30 s (state '$state')"

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
