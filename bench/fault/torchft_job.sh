#!/usr/bin/env bash
# One torchft job as torchft's README runs train_ddp.py: a lighthouse, then one torchrun per
# replica group (one process each, --max-restarts 1 so a killed replica is started again and
# healed by torchft from a live peer). Waits for every replica group, then stops the lighthouse.
#   torchft_job.sh GROUPS MIN_REPLICAS TOTAL_STEPS LOSS_LOG [fault_train.py options...]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../python.sh"
groups=$1 min_replicas=$2 total=$3 loss_log=$4
shift 4
bin=$(dirname "$PY")
port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$bin/torchft_lighthouse" --min_replicas "$min_replicas" --quorum_tick_ms 100 \
  --join_timeout_ms 10000 --bind "127.0.0.1:$port" &
lighthouse=$!
trap 'kill "$lighthouse" 2>/dev/null || true' EXIT
export TORCHFT_LIGHTHOUSE=http://127.0.0.1:$port NUM_REPLICA_GROUPS=$groups
pids=()
for ((g = 0; g < groups; g++)); do
  REPLICA_GROUP_ID=$g "$TORCHRUN" --standalone --nproc-per-node 1 --max-restarts 1 \
    "$here/fault_train.py" torchft --total-steps "$total" --min-replicas "$min_replicas" \
    --loss-log "$loss_log" "$@" 2>&1 | sed "s/^/[group $g] /" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
