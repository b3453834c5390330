# A real single-node SLURM cluster for the tests in this folder, sourced by them: munged,
# slurmctld and slurmd started from a throw-away config under a temp dir $T (non-default free
# ports), SLURM_CONF exported, the node idle when this returns. On exit (the EXIT trap) the
# jobs named $SLURM_TEST_JOB_NAME are cancelled, the daemons stopped and $T removed; the logs
# are printed when the test failed.
# Defines skip REASON (exit 77, ctest: skipped), fail REASON (exit 1), free_port, $T, $HOST.
# Skips when not root or when the slurm/munge binaries are absent (scripts/install-deps.sh
# test installs slurm-wlm and munge). Bounded: every wait has a limit.
SLURM_TEST_JOB_NAME=${SLURM_TEST_JOB_NAME:-ddp-slurm-test}
SLURM_TEST_LOGS=${SLURM_TEST_LOGS:-"slurmctld.log slurmd.log munged.log job.out"}
# Optional: SLURM_TEST_CRED_EXPIRE (seconds; also how long a requeued job waits before it may
# start again, 120 by default) and SLURM_TEST_EXTRA_CONF (lines added to slurm.conf).

skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "needs root (slurmd runs jobs as root with SlurmUser=root)"
for tool in munged slurmctld slurmd sbatch srun sinfo scontrol; do
  command -v "$tool" >/dev/null 2>&1 || PATH="$PATH:/usr/sbin"
  command -v "$tool" >/dev/null 2>&1 || skip "$tool not found (Debian packages slurm-wlm and munge)"
done

T=$(mktemp -d /tmp/ddp-slurm-XXXXXX)
chmod 755 "$T"
PIDS=()
cleanup() {
  local rc=$?
  if [[ -f "$T/slurm.conf" ]]; then
    SLURM_CONF="$T/slurm.conf" timeout 5 scancel --quiet --full "--name=$SLURM_TEST_JOB_NAME" 2>/dev/null || true
  fi
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  done
  if [[ $rc -ne 0 && $rc -ne 77 ]]; then
    for log in $SLURM_TEST_LOGS; do
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
AuthInfo=socket=$T/munge.sock${SLURM_TEST_CRED_EXPIRE:+,cred_expire=$SLURM_TEST_CRED_EXPIRE}
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
${SLURM_TEST_EXTRA_CONF:-}
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

