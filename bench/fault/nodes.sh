#!/usr/bin/env bash
# Runs one job as NODES agents on this machine, each a simulated host: node k's agent and its
# workers run with DDP_HOST_ID=fault-node<k>, so ddp's cpu backend uses shared memory within a
# node and its TCP ring between nodes, as on separate machines (PyTorch's gloo is TCP
# throughout either way). The agents meet in a c10d rendezvous on 127.0.0.1:PORT (the first
# serves it, the others join as clients; ddprun and torchrun both do so).
#
#   nodes.sh NODES PORT LAUNCHER [LAUNCHER_ARGS...]   (ddprun or torchrun, without --standalone)
#
# Exits with the first non-zero exit status among the agents, 0 when all ended 0.
set -uo pipefail
nodes=${1:?usage: nodes.sh NODES PORT LAUNCHER [ARGS...]}
port=${2:?}
shift 2
pids=()
for ((k = 0; k < nodes; k++)); do
  DDP_HOST_ID="fault-node$k" "$1" --nnodes "$nodes" --rdzv-backend c10d \
    --rdzv-endpoint "127.0.0.1:$port" --rdzv-id fault "${@:2}" &
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do
  wait "$pid"
  status=$?
  ((rc == 0)) && rc=$status
done
exit "$rc"
