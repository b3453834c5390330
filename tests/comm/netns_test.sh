#!/usr/bin/env bash
# Two "hosts" as network namespaces joined by a veth pair (10.77.0.1/24 <-> 10.77.0.2/24).
# Runs comm_worker with 2 ranks per namespace (DDP_HOST_ID differs per namespace, so the cpu
# backend goes hierarchical: shared memory within a namespace, Gloo over the veth between
# them) for the gloo and cpu backends. Exits 77 (ctest: skipped) with the reason when not root
# or `ip netns` is unavailable. The namespaces are always removed.
#
#   netns_test.sh /path/to/comm_worker
set -u
WORKER=${1:?usage: netns_test.sh /path/to/comm_worker}
NS_A=ddpcommA$$
NS_B=ddpcommB$$

skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"

cleanup() {
  ip netns del "$NS_A" 2>/dev/null
  ip netns del "$NS_B" 2>/dev/null
}
trap cleanup EXIT

ip netns add "$NS_A" 2>/dev/null || skip "ip netns add failed (no CAP_SYS_ADMIN in this container?)"
ip netns add "$NS_B" || skip "ip netns add failed"
ip link add vethA$$ type veth peer name vethB$$ 2>/dev/null || skip "cannot create a veth pair"
ip link set vethA$$ netns "$NS_A"
ip link set vethB$$ netns "$NS_B"
ip -n "$NS_A" addr add 10.77.0.1/24 dev vethA$$
ip -n "$NS_B" addr add 10.77.0.2/24 dev vethB$$
for ns in "$NS_A" "$NS_B"; do
  ip -n "$ns" link set lo up
done
ip -n "$NS_A" link set vethA$$ up
ip -n "$NS_B" link set vethB$$ up

# Fresh namespaces have no other listeners, so a fixed port cannot collide.
PORT=29511
failures=0
for backend in gloo cpu; do
  pids=()
  logs=()
  for rank in 0 1 2 3; do
    if [ $rank -lt 2 ]; then ns=$NS_A; host=hostA; else ns=$NS_B; host=hostB; fi
    log=$(mktemp)
    logs+=("$log")
    ip netns exec "$ns" env RANK=$rank WORLD_SIZE=4 LOCAL_RANK=$((rank % 2)) \
      MASTER_ADDR=10.77.0.1 MASTER_PORT=$PORT DDP_HOST_ID=$host \
      timeout 120 "$WORKER" "$backend" >"$log" 2>&1 &
    pids+=($!)
  done
  for i in 0 1 2 3; do
    if ! wait "${pids[$i]}"; then
      echo "FAIL: backend $backend rank $i:"
      cat "${logs[$i]}"
      failures=$((failures + 1))
    fi
    rm -f "${logs[$i]}"
  done
  [ $failures -eq 0 ] && echo "ok: backend $backend, 4 ranks on 2 namespaces over veth"
  PORT=$((PORT + 1))
done
exit $((failures > 0))
