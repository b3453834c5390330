#!/usr/bin/env bash
# Runs one job as NODES agents on this machine, each a host of its own, meeting in a c10d
# rendezvous at node 0's address:PORT (node 0's agent serves it, the others join as clients;
# ddprun and torchrun both do so). What a host is:
#   FAULT_HOSTS=simulated (default)  node k's agent and workers run with DDP_HOST_ID=fault-node<k>
#       on this machine's one network stack (the rendezvous on 127.0.0.1), so ddp's cpu backend
#       uses shared memory within a node and its TCP ring between nodes, as on separate
#       machines (PyTorch's gloo is TCP throughout either way)
#   FAULT_HOSTS=netns  node k runs in a network namespace of its own (bench/fault/netns.sh:
#       10.79.0.<k+1>, traffic between nodes over veths and a bridge); torchrun is given
#       --local-addr (the nodes share one host name) and, on node 0, --rdzv-conf is_host=1
#       (it cannot tell from the host name that the endpoint is its own address)
#
#   nodes.sh NODES PORT LAUNCHER [LAUNCHER_ARGS...]   (ddprun or torchrun, without --standalone)
#
# Exits with the first non-zero exit status among the agents, 0 when all ended 0.
set -uo pipefail
nodes=${1:?usage: nodes.sh NODES PORT LAUNCHER [ARGS...]}
port=${2:?}
shift 2
launcher=$1
shift
hosts=${FAULT_HOSTS:-simulated}
case $hosts in
  simulated) endpoint=127.0.0.1 ;;
  netns)
    source "$(dirname "$0")/netns.sh"
    netns_setup "$nodes" || exit 1
    endpoint=$(netns_addr 0) ;;
  *) echo "bench/fault/nodes.sh: FAULT_HOSTS=$hosts: expected simulated or netns" >&2; exit 2 ;;
esac
pids=()
for ((k = 0; k < nodes; k++)); do
  args=(--nnodes "$nodes" --rdzv-backend c10d --rdzv-endpoint "$endpoint:$port" --rdzv-id fault)
  if [[ $hosts == netns ]]; then
    if [[ $(basename "$launcher") == torchrun ]]; then
      args+=(--local-addr "$(netns_addr "$k")")
      ((k == 0)) && args+=(--rdzv-conf is_host=1)
    fi
    netns_exec "$k" "$launcher" "${args[@]}" "$@" &
  else
    DDP_HOST_ID="fault-node$k" "$launcher" "${args[@]}" "$@" &
  fi
  pids+=($!)
done
rc=0
for pid in "${pids[@]}"; do
  wait "$pid"
  status=$?
  ((rc == 0)) && rc=$status
done
exit "$rc"
