# Sourced by bench/fault/nodes.sh and torchft_job.sh when FAULT_HOSTS=netns: hosts of their own
# on this machine. Each node is a network namespace (its own network stack: loopback, routes,
# ports) with a veth to a bridge in a hub namespace of its own, node k at 10.79.0.<k+1>/24 on
# interface fault0. Traffic between nodes crosses the veths and the bridge, as between
# machines; the processes still share this machine's CPUs, files and /dev/shm (ddp's cpu
# backend is told the hosts apart by DDP_HOST_ID, set by netns_exec). Needs root and iproute2.
#
#   netns_setup N            creates the hub and nodes 0..N-1; removed by netns_cleanup,
#                            which netns_setup installs as the EXIT trap
#   netns_addr K             node K's address
#   netns_exec K CMD...      runs CMD in node K's namespace with DDP_HOST_ID=fault-netns<K>,
#                            GLOO_SOCKET_IFNAME=fault0 and FAULT_NODE_ADDR=<its address>

_netns_tag="f$$"
_netns_list=()

netns_addr() { echo "10.79.0.$(($1 + 1))"; }
_netns_name() { echo "${_netns_tag}-$1"; }

netns_cleanup() {
  local ns
  for ns in "${_netns_list[@]}"; do ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null; done
  for ns in "${_netns_list[@]}"; do ip netns del "$ns" 2>/dev/null; done
  _netns_list=()
}

netns_setup() {
  local n=$1 hub ns k
  if [[ $(id -u) -ne 0 ]] || ! command -v ip >/dev/null; then
    echo "bench/fault: FAULT_HOSTS=netns needs root and iproute2 (ip)" >&2
    return 1
  fi
  trap netns_cleanup EXIT
  hub=$(_netns_name hub)
  ip netns add "$hub" || return 1
  _netns_list+=("$hub")
  ip -n "$hub" link set lo up
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" link set br0 up
  for ((k = 0; k < n; k++)); do
    ns=$(_netns_name "$k")
    ip netns add "$ns" || return 1
    _netns_list+=("$ns")
    ip link add "${_netns_tag}h$k" netns "$hub" type veth peer name fault0 netns "$ns" || return 1
    ip -n "$hub" link set "${_netns_tag}h$k" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "$(netns_addr "$k")/24" dev fault0
    ip -n "$ns" link set fault0 up
  done
}

netns_exec() {
  local k=$1
  shift
  ip netns exec "$(_netns_name "$k")" env DDP_HOST_ID="fault-netns$k" GLOO_SOCKET_IFNAME=fault0 \
    FAULT_NODE_ADDR="$(netns_addr "$k")" "$@"
}
