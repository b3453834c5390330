# Helpers of the multi-node tests on one machine (sourced by netns_test.sh and
# k8s_operators_test.sh): every node is its own network namespace with a veth to a bridge (in a
# hub namespace of its own, so the host's firewall never sees the traffic), addresses
# 10.78.0.<i+1>/24 on interface rdzv0. No packet leaves loopback and these namespaces.
#
# The sourcing script sets DDPRUN (the ddprun to start) and PY (an interpreter with torch),
# and gets T (a temp dir, removed at exit with every namespace and agent), fail, setup_nodes,
# start_agent, start_torchrun, kill_node and the bounded waits below. Exits 77 (ctest: skipped)
# with the reason when not root or without iproute2.
skip() { echo "SKIP: $*"; exit 77; }
[[ $(id -u) -eq 0 ]] || skip "network namespaces need root (run the suite as root)"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
ip netns add "rdzvprobe$$" 2>/dev/null || skip "cannot create network namespaces here"
ip netns del "rdzvprobe$$"

TAG="$$"
HUB="rdzv$TAG-hub"
T=$(mktemp -d /tmp/rdzv-netns.XXXXXX)
NAMESPACES=()
AGENT_PIDS=()

cleanup() {
  for pid in "${AGENT_PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
  for pid in "${AGENT_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  for ns in "${NAMESPACES[@]}"; do ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null; done
  for ns in "${NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null; rm -rf "/etc/netns/$ns"; done
  rm -rf "$T"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for f in "$T"/*.log; do [[ -e "$f" ]] && { echo "---- $(basename "$f")"; tail -n 60 "$f"; }; done
  exit 1
}

ns_of() { echo "rdzv$TAG-$1"; }

# setup_nodes N: namespaces 0..N-1, node i at 10.78.0.(i+1) on interface rdzv0.
setup_nodes() {
  ip netns add "$HUB" && NAMESPACES+=("$HUB") || fail "cannot create $HUB"
  ip -n "$HUB" link set lo up
  ip -n "$HUB" link add br0 type bridge
  ip -n "$HUB" link set br0 up
  for ((i = 0; i < $1; i++)); do
    local ns
    ns=$(ns_of "$i")
    ip netns add "$ns" && NAMESPACES+=("$ns") || fail "cannot create $ns"
    ip link add "rh$TAG-$i" netns "$HUB" type veth peer name rdzv0 netns "$ns" ||
      fail "cannot create the veth pair of node $i"
    ip -n "$HUB" link set "rh$TAG-$i" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "10.78.0.$((i + 1))/24" dev rdzv0
    ip -n "$ns" link set rdzv0 up
  done
}

# start_agent NODE LOG ARGS...: ddprun in node NODE's namespace; its pid in LAST_PID.
start_agent() {
  local node=$1 log=$2
  shift 2
  ip netns exec "$(ns_of "$node")" env GLOO_SOCKET_IFNAME=rdzv0 DDP_STORE_TOKEN= \
    "$DDPRUN" "$@" >"$T/$log.log" 2>&1 &
  LAST_PID=$!
  AGENT_PIDS+=("$LAST_PID")
}

# start_torchrun NODE LOG ARGS...: PyTorch's torchrun in node NODE's namespace.
start_torchrun() {
  local node=$1 log=$2
  shift 2
  ip netns exec "$(ns_of "$node")" env GLOO_SOCKET_IFNAME=rdzv0 \
    "$PY" -m torch.distributed.run "$@" >"$T/$log.log" 2>&1 &
  LAST_PID=$!
  AGENT_PIDS+=("$LAST_PID")
}

# kill_node NODE: SIGKILL every process in node NODE's namespace (the machine dies).
kill_node() {
  ip netns pids "$(ns_of "$1")" | xargs -r kill -9
}

# wait_exit PID LIMIT_S: the exit code, or fail when still running after LIMIT_S.
wait_exit() {
  local pid=$1 limit=$2
  for ((k = 0; k < limit * 10; k++)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      return $?
    fi
    sleep 0.1
  done
  fail "process $pid still running after $limit s"
}

# wait_grep LIMIT_S PATTERN FILE...: until every FILE contains PATTERN.
wait_grep() {
  local limit=$1 pattern=$2
  shift 2
  for ((k = 0; k < limit * 10; k++)); do
    local all=1
    for f in "$@"; do grep -q -- "$pattern" "$f" 2>/dev/null || all=0; done
    ((all)) && return 0
    sleep 0.1
  done
  fail "'$pattern' did not appear in $* within $limit s"
}

# wait_for_text FILE TEXT LIMIT_S: whether FILE holds TEXT within LIMIT_S.
wait_for_text() {
  for ((k = 0; k < $3 * 10; k++)); do
    grep -qF -- "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# wait_for_commit FILE STEP LIMIT_S: whether the commit log FILE ("pid step world" lines,
# recovery_worker) reaches STEP within LIMIT_S.
wait_for_commit() {
  for ((k = 0; k < $3 * 10; k++)); do
    [[ -f "$1" ]] && awk -v s="$2" '$2 >= s {found = 1} END {exit !found}' "$1" && return 0
    sleep 0.1
  done
  return 1
}

expect_in() {  # expect_in FILE TEXT
  grep -qF -- "$2" "$1" || fail "$(basename "$1") lacks: $2"
}
