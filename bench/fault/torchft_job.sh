#!/usr/bin/env bash
# One torchft job as torchft's README runs train_ddp.py: a lighthouse, then one torchrun per
# replica group (one process each, --max-restarts 1 so a killed replica is started again and
# healed by torchft from a live peer). Waits for every replica group, then stops the lighthouse.
#   torchft_job.sh GROUPS MIN_REPLICAS TOTAL_STEPS LOSS_LOG [fault_train.py options...]
# FAULT_HOSTS=netns NODES=N: the replica groups are spread over N network-namespace hosts
# (bench/fault/netns.sh; groups 0..GROUPS/N-1 on node 0, and so on), the lighthouse on node 0;
# each replica advertises its node's address (FAULT_NODE_ADDR, read by fault_train.py).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/../python.sh"
groups=$1 min_replicas=$2 total=$3 loss_log=$4
shift 4
bin=$(dirname "$PY")
nodes=${NODES:-1}
host=127.0.0.1
on_node=()  # on_node K: the command prefix that runs a command on node K (one host: none)
if [[ ${FAULT_HOSTS:-simulated} == netns ]]; then
  source "$here/netns.sh"
  netns_setup "$nodes"  # its EXIT trap kills every process on the nodes, the lighthouse too
  host=$(netns_addr 0)
fi
node_prefix() {
  on_node=()
  [[ ${FAULT_HOSTS:-simulated} == netns ]] && on_node=(netns_exec "$1")
  return 0
}
port=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
node_prefix 0
"${on_node[@]}" "$bin/torchft_lighthouse" --min_replicas "$min_replicas" --quorum_tick_ms 100 \
  --join_timeout_ms 10000 --bind "$host:$port" &
lighthouse=$!
[[ ${FAULT_HOSTS:-simulated} == netns ]] || trap 'kill "$lighthouse" 2>/dev/null || true' EXIT
export TORCHFT_LIGHTHOUSE=http://$host:$port NUM_REPLICA_GROUPS=$groups
pids=()
for ((g = 0; g < groups; g++)); do
  node_prefix $((g * nodes / groups))
  "${on_node[@]}" env REPLICA_GROUP_ID=$g \
    "$TORCHRUN" --standalone --nproc-per-node 1 --max-restarts 1 \
    "$here/fault_train.py" torchft --total-steps "$total" --min-replicas "$min_replicas" \
    --loss-log "$loss_log" "$@" 2>&1 | sed "s/^/[group $g] /" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
kill "$lighthouse" 2>/dev/null || true
exit $rc
