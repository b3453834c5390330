#!/usr/bin/env bash
# ddprun with --rdzv-backend etcd / etcd-v2 against a real etcd that this script starts on
# loopback (free ports, a temporary data dir; every etcd and agent killed at the end).
#
# Usage: etcd_test.sh SCENARIO DDPRUN WORKERS_DIR [PYTHON]   (PYTHON finds free ports)
#   elastic  --nnodes 2:3 on etcd: two agents form round 0 (2 nodes), a third is admitted
#            (round 1, 3 nodes), its agent is SIGKILLed and the others name it ("missed 3
#            heartbeats") and go on as round 2 with 2 nodes; both end 0 (--max-restarts 0:
#            membership changes do not count)
#   tls      etcd with TLS client-certificate authentication (openssl makes the CAs and
#            certificates): the right files run a job; a certificate of another CA, a cacert
#            that does not verify etcd, plain HTTP, no client certificate, an unreachable
#            endpoint, an endpoint that is not etcd and an etcd whose server certificate lacks
#            client usage (its own gateway is refused) each end at once with their message;
#            `ddprun doctor` passes the right files and names a wrong cacert; `ddprun stacks`
#            on one of two agents gets the other's stacks through etcd
#   netns    root only (exit 77 otherwise): etcd and two nodes each in a network namespace
#            (10.79.0.1-3 on a bridge); --nnodes 1:2 forms with both, MASTER_ADDR a node's
#            address; node 1's link goes down: node 0 names it and goes on alone (ends 0),
#            node 1 fails within read_timeout saying it cannot reach etcd
#   cluster  a 3-member etcd cluster loses the member the agents talk to (SIGKILL) while a
#            2-node job runs (etcd-v2): the job does not notice (one round) and ends 0
#   doctor   `ddprun doctor --rdzv-backend etcd`: a healthy member (version, leader, a timed
#            write); a refused port and etcd's peer port among the members; members of two
#            different clusters; a 3-member cluster that lost 2 members (no leader)
# KEEP_T=1 keeps the temporary directory (logs, certificates) for a look afterwards.
# Exit 77 (ctest: skipped) with the reason only when etcd is not installed. Every wait is
# bounded.
set -uo pipefail

SCENARIO="${1:?usage: etcd_test.sh SCENARIO DDPRUN WORKERS_DIR}"
DDPRUN=$(realpath "${2:?}")
WORKERS=$(realpath "${3:?}")
PY="${4:-python3}"
ETCD=$(command -v etcd || true)
[[ -n "$ETCD" ]] || {
  echo "SKIP: etcd is not installed (Debian etcd-server; scripts/install-deps.sh test installs it)"
  exit 77
}

# etcd and the agents die with this script even when it is killed (a ctest timeout), not only
# through the EXIT trap.
PDEATH=()
setpriv --help 2>/dev/null | grep pdeathsig >/dev/null && PDEATH=(setpriv --pdeathsig KILL)
T=$(mktemp -d /tmp/ddp-etcd-test.XXXXXX)
PIDS=()
cleanup() {
  touch "$T/done" 2>/dev/null
  for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  [[ -n "${KEEP_T:-}" ]] || rm -rf "$T"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*"
  for f in "$T"/*.log; do [[ -e "$f" ]] && { echo "---- $(basename "$f")"; tail -n 40 "$f"; }; done
  exit 1
}

# free_ports N: sets FREE_PORT to the first of N consecutive free loopback ports in 20000-32000
# (below the ephemeral range), each claimed for this script's lifetime with the lock files of
# tests/support/free_ports.py: a port only probed free was taken by a concurrent test's server
# before etcd bound it ("bind: address already in use", CI). Not in $(...): a subshell's claim
# would end with it.
free_ports() {
  local n=$1 base k fd claimed
  mkdir -p -m 1777 /tmp/ddp-test-ports 2>/dev/null
  for ((base = 20000 + $$ % 10000 / n * n; base + n <= 32000; base += n)); do
    claimed=1
    for ((k = 0; k < n && claimed; k++)); do
      exec {fd}>>"/tmp/ddp-test-ports/$((base + k)).lock" || { claimed=0; break; }
      flock -n "$fd" || { exec {fd}>&-; claimed=0; }
    done
    ((claimed)) || continue
    if "$PY" -c 'import socket, sys
for p in sys.argv[1:]: socket.socket().bind(("127.0.0.1", int(p)))' \
      $(seq "$base" $((base + n - 1))) 2>/dev/null; then
      FREE_PORT=$base
      return 0
    fi
  done
  echo "FAIL: no $n consecutive free ports in 20000-32000" >&2
  exit 1
}

# start_etcd NAME MEMBERS SCHEME [EXTRA ARGS...]: an etcd cluster; client ports in ETCD_PORTS,
# pids in ETCD_PIDS, "127.0.0.1:P,..." in ETCD_ENDPOINTS.
start_etcd() {
  local name=$1 members=$2 scheme=$3
  shift 3
  local base peers=() i
  free_ports $((2 * members))
  base=$FREE_PORT
  ETCD_PORTS=()
  ETCD_PIDS=()
  for ((i = 0; i < members; i++)); do
    ETCD_PORTS+=($((base + 2 * i)))
    peers+=("m$i=http://127.0.0.1:$((base + 2 * i + 1))")
  done
  local cluster
  cluster=$(IFS=,; echo "${peers[*]}")
  for ((i = 0; i < members; i++)); do
    local client="$scheme://127.0.0.1:${ETCD_PORTS[i]}" peer="http://127.0.0.1:$((base + 2 * i + 1))"
    "${PDEATH[@]}" "$ETCD" --name "m$i" --data-dir "$T/$name-m$i" --listen-client-urls "$client" \
      --advertise-client-urls "$client" --listen-peer-urls "$peer" \
      --initial-advertise-peer-urls "$peer" --initial-cluster "$cluster" \
      --initial-cluster-state new "$@" >"$T/etcd-$name-m$i.log" 2>&1 &
    ETCD_PIDS+=($!)
    PIDS+=($!)
  done
  ETCD_ENDPOINTS=$(printf '127.0.0.1:%s,' "${ETCD_PORTS[@]}")
  ETCD_ENDPOINTS=${ETCD_ENDPOINTS%,}
  # Ready: every member has reported serving client requests (bounded).
  for ((i = 0; i < members; i++)); do
    wait_grep 60 "ready to serve client requests" "$T/etcd-$name-m$i.log"
  done
}

# start_agent LOG TAG ARGS...: ddprun in the background; its pid in LAST_PID.
start_agent() {
  local log=$1 tag=$2
  shift 2
  NODE_TAG=$tag DONE_FILE="$T/done" "${PDEATH[@]}" "$DDPRUN" "$@" >"$T/$log.log" 2>&1 &
  LAST_PID=$!
  PIDS+=($!)
}

wait_exit() {  # wait_exit PID LIMIT_S: the exit code, or fail when still running
  local pid=$1 limit=$2 k
  for ((k = 0; k < limit * 10; k++)); do
    if ! kill -0 "$pid" 2>/dev/null; then
      wait "$pid"
      return $?
    fi
    sleep 0.1
  done
  fail "process $pid still running after $limit s"
}

wait_grep() {  # wait_grep LIMIT_S PATTERN FILE...: until every FILE contains PATTERN
  local limit=$1 pattern=$2 k
  shift 2
  for ((k = 0; k < limit * 10; k++)); do
    local all=1 f
    for f in "$@"; do grep -q -- "$pattern" "$f" 2>/dev/null || all=0; done
    ((all)) && return 0
    sleep 0.1
  done
  fail "'$pattern' did not appear in $* within $limit s"
}

wait_count() {  # wait_count LIMIT_S PATTERN N FILE...: until every FILE has N lines with PATTERN
  local limit=$1 pattern=$2 n=$3 k
  shift 3
  for ((k = 0; k < limit * 10; k++)); do
    local all=1 f
    for f in "$@"; do (($(grep -c -- "$pattern" "$f" 2>/dev/null) >= n)) || all=0; done
    ((all)) && return 0
    sleep 0.1
  done
  fail "'$pattern' did not appear $n times in each of $* within $limit s"
}

expect_in() { grep -qF -- "$2" "$1" || fail "$(basename "$1") lacks: $2"; }
expect_not_in() { ! grep -qF -- "$2" "$1" || fail "$(basename "$1") has: $2"; }

WORKER="$WORKERS/wait_worker.sh"
FAST=last_call_timeout=1,heartbeat=0.5,join_timeout=60

case "$SCENARIO" in
elastic)
  start_etcd e 1 http
  common=(--nnodes 2:3 --nproc-per-node 1 --max-restarts 0 --rdzv-backend etcd
          --rdzv-endpoint "$ETCD_ENDPOINTS" --rdzv-id elastic1 --rdzv-conf "$FAST" "$WORKER")
  start_agent a A "${common[@]}"; A=$LAST_PID
  start_agent b B "${common[@]}"; B=$LAST_PID
  wait_grep 60 "world=2" "$T/a.log" "$T/b.log"
  start_agent c C "${common[@]}"; C=$LAST_PID
  wait_grep 60 "rendezvous round 1 of run 'elastic1': 3 nodes" "$T/a.log" "$T/b.log" "$T/c.log"
  wait_grep 60 "world=3" "$T/a.log" "$T/b.log" "$T/c.log"
  kill -9 "$C"
  wait_grep 60 "rendezvous round 2 of run 'elastic1': 2 nodes" "$T/a.log" "$T/b.log"
  wait_count 60 "world=2" 2 "$T/a.log" "$T/b.log"
  grep -qF "missed 3 heartbeats" "$T/a.log" "$T/b.log" ||
    fail "no survivor named the lost node (missed 3 heartbeats)"
  touch "$T/done"
  wait_exit "$A" 60; ra=$?
  wait_exit "$B" 60; rb=$?
  [[ $ra -eq 0 && $rb -eq 0 ]] || fail "agents ended $ra and $rb, expected 0 and 0"
  echo "PASS: etcd elastic 2 -> 3 -> 2 nodes"
  ;;
tls)
  cd "$T" || exit 1
  mkca() {  # mkca NAME: a CA
    openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=$1" -keyout "$1.key" \
      -out "$1.pem" >/dev/null 2>&1 || fail "openssl: CA $1"
  }
  mkcert() {  # mkcert NAME CA USAGE: a certificate for 127.0.0.1 signed by CA
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$1" -keyout "$1.key" -out "$1.csr" \
      >/dev/null 2>&1 || fail "openssl: request $1"
    printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=%s\n' "$3" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days 2 \
      -extfile "$1.ext" -out "$1.pem" >/dev/null 2>&1 || fail "openssl: sign $1"
  }
  mkca ca
  mkca rogue
  # etcd's JSON gateway connects to etcd's own gRPC port with the server certificate as its
  # client certificate: it needs both usages.
  mkcert server ca serverAuth,clientAuth
  mkcert node ca clientAuth
  mkcert stranger rogue clientAuth
  start_etcd t 1 https --cert-file server.pem --key-file server.key --client-cert-auth \
    --trusted-ca-file ca.pem
  EP="$ETCD_ENDPOINTS"
  job=(--nnodes 1 --nproc-per-node 1 --rdzv-backend etcd --rdzv-endpoint "$EP" --rdzv-id tls1)
  run_job() {  # run_job LOG CONF: a 1-node job; its exit code
    touch "$T/done"
    start_agent "$1" X "${job[@]}" --rdzv-conf "$2" "$WORKER"
    wait_exit "$LAST_PID" 60
  }
  good="protocol=https,cacert=$T/ca.pem,cert=$T/node.pem,key=$T/node.key,join_timeout=30"
  run_job good "$good"; rc=$?
  [[ $rc -eq 0 ]] || fail "the job with the right certificates ended $rc"
  expect_in "$T/good.log" "WORKER node=X"
  expect_in "$T/good.log" "world=1"

  # ddprun doctor with the job's TLS keys: the right files pass, a cacert that does not verify
  # etcd fails with the same message as the job.
  timeout 60 "$DDPRUN" doctor --rdzv-backend etcd --rdzv-endpoint "$EP" --rdzv-conf "$good" \
    >"$T/doctor-good.log" 2>&1 || fail "ddprun doctor with the right certificates exited $?"
  expect_in "$T/doctor-good.log" "[ ok ] etcd-write"
  timeout 60 "$DDPRUN" doctor --rdzv-backend etcd --rdzv-endpoint "$EP" \
    --rdzv-conf "protocol=https,cacert=$T/rogue.pem,cert=$T/node.pem,key=$T/node.key" \
    >"$T/doctor-wrongca.log" 2>&1 && fail "ddprun doctor passed a cacert that does not verify etcd"
  expect_in "$T/doctor-wrongca.log" "presented a server certificate that cacert=$T/rogue.pem does not verify"

  # `ddprun stacks` across two agents of an etcd job with client certificates: node 0's agent
  # asks node 1's through etcd (a runtime folder each, so only etcd connects them).
  if command -v eu-stack >/dev/null; then
    for n in 0 1; do
      DDPRUN_RUNTIME_DIR="$T/rt$n" start_agent "stacks$n" X --nnodes 2 --nproc-per-node 2 \
        --rdzv-backend etcd --rdzv-endpoint "$EP" --rdzv-id tlsstacks --rdzv-conf "$good" \
        --no-python /bin/sleep 120
      stack_agents[n]=$LAST_PID
    done
    wait_grep 60 "rendezvous round" "$T/stacks0.log" "$T/stacks1.log"
    for ((k = 0; k < 60; k++)); do
      DDPRUN_RUNTIME_DIR="$T/rt0" timeout 30 "$DDPRUN" stacks --run-id tlsstacks --timeout 10 \
        >"$T/stacks.log" 2>&1
      grep -q "4 ranks from 2 of 2 nodes" "$T/stacks.log" && grep -q "nanosleep" "$T/stacks.log" &&
        break
      sleep 0.5
    done
    expect_in "$T/stacks.log" "ddprun stacks: run 'tlsstacks', 4 ranks from 2 of 2 nodes"
    expect_in "$T/stacks.log" "ranks 0-3 (4 of 4), eu-stack"
    kill "${stack_agents[@]}"
    for p in "${stack_agents[@]}"; do wait_exit "$p" 30; done
  else
    echo "note: no eu-stack (apt-get install elfutils): ddprun stacks over etcd not checked"
  fi

  run_job stranger "protocol=https,cacert=$T/ca.pem,cert=$T/stranger.pem,key=$T/stranger.key"
  rc=$?
  [[ $rc -ne 0 ]] || fail "a certificate of another CA was accepted"
  expect_in "$T/stranger.log" "refused this node's client certificate cert=$T/stranger.pem"
  expect_in "$T/stranger.log" "--trusted-ca-file"
  expect_not_in "$T/stranger.log" "WORKER"

  run_job wrongca "protocol=https,cacert=$T/rogue.pem,cert=$T/node.pem,key=$T/node.key"
  [[ $? -ne 0 ]] || fail "a cacert that does not verify etcd was accepted"
  expect_in "$T/wrongca.log" "presented a server certificate that cacert=$T/rogue.pem does not verify"

  run_job nocert "protocol=https,cacert=$T/ca.pem"
  [[ $? -ne 0 ]] || fail "a node without a client certificate was accepted"
  expect_in "$T/nocert.log" "requires a client certificate"

  run_job plain "join_timeout=30,connect_timeout=1"
  [[ $? -ne 0 ]] || fail "plain HTTP to an HTTPS etcd was accepted"
  expect_in "$T/plain.log" "as an etcd that serves HTTPS does to plain HTTP: pass --rdzv-conf protocol=https"

  free_ports 1
  dead=$FREE_PORT
  job=(--nnodes 1 --nproc-per-node 1 --rdzv-backend etcd --rdzv-endpoint "127.0.0.1:$dead" --rdzv-id tls1)
  run_job unreachable "connect_timeout=1"
  [[ $? -ne 0 ]] || fail "an unreachable endpoint did not fail"
  expect_in "$T/unreachable.log" "cannot reach etcd for POST /v3/kv/range (127.0.0.1:$dead:"
  expect_in "$T/unreachable.log" "retried for"

  # An endpoint that is not etcd: the peer port of the running etcd (it answers 404).
  job=(--nnodes 1 --nproc-per-node 1 --rdzv-backend etcd --rdzv-endpoint "127.0.0.1:$((ETCD_PORTS[0] + 1))" --rdzv-id tls1)
  run_job notetcd "join_timeout=30"
  [[ $? -ne 0 ]] || fail "an endpoint that is not etcd was accepted"
  expect_in "$T/notetcd.log" "not etcd's v3 JSON API"
  # An etcd whose server certificate lacks client usage: its own JSON gateway is refused.
  mkcert serveronly ca serverAuth
  start_etcd t2 1 https --cert-file serveronly.pem --key-file serveronly.key --client-cert-auth \
    --trusted-ca-file ca.pem
  job=(--nnodes 1 --nproc-per-node 1 --rdzv-backend etcd --rdzv-endpoint "$ETCD_ENDPOINTS" --rdzv-id tls1)
  run_job gateway "protocol=https,cacert=$T/ca.pem,cert=$T/node.pem,key=$T/node.key,connect_timeout=1"
  [[ $? -ne 0 ]] || fail "an etcd whose gateway cannot reach it was usable"
  expect_in "$T/gateway.log" "must also allow client authentication (extendedKeyUsage serverAuth, clientAuth)"
  echo "PASS: etcd TLS: right certificates run; wrong ones, plain HTTP, unreachable and non-etcd endpoints fail with their message"
  ;;
doctor)
  doctor() {  # doctor LOG ENDPOINTS [ARGS...]: ddprun doctor on etcd; its exit code
    local log=$1 eps=$2
    shift 2
    timeout 60 "$DDPRUN" doctor --rdzv-backend etcd --rdzv-endpoint "$eps" --timeout 2 "$@" \
      >"$T/$log.log" 2>&1
  }
  start_etcd d 1 http
  EP="$ETCD_ENDPOINTS"
  doctor healthy "$EP" || fail "doctor on a healthy etcd exited $?"
  expect_in "$T/healthy.log" "[ ok ] etcd $EP etcd 3."
  expect_in "$T/healthy.log" "(the leader), raft term"
  expect_in "$T/healthy.log" "[ ok ] etcd-cluster        1 of 1 listed members answer, one cluster"
  grep -q '^\[ ok \] etcd-write          wrote, read back and deleted the probe key /ddprun/doctor/' \
    "$T/healthy.log" || fail "healthy.log lacks the timed write"

  free_ports 1
  dead=$FREE_PORT
  peer="127.0.0.1:$((ETCD_PORTS[0] + 1))"
  doctor broken "$EP,127.0.0.1:$dead,$peer" && fail "doctor passed a refused port and a peer port"
  expect_in "$T/broken.log" "[FAIL] etcd 127.0.0.1:$dead cannot reach etcd"
  expect_in "$T/broken.log" "Connection refused"
  expect_in "$T/broken.log" "[FAIL] etcd $peer etcd at $peer answered"
  expect_in "$T/broken.log" "not etcd's v3 JSON API"
  expect_in "$T/broken.log" "[warn] etcd-cluster        1 of 3 listed members answer"
  expect_in "$T/broken.log" "[ ok ] etcd-write"

  first="$EP"
  start_etcd d2 1 http
  doctor two "$first,$ETCD_ENDPOINTS" && fail "doctor passed members of two clusters"
  expect_in "$T/two.log" "[FAIL] etcd-cluster        the endpoints belong to 2 different etcd clusters"

  start_etcd q 3 http
  survivor="127.0.0.1:${ETCD_PORTS[2]}"
  kill -9 "${ETCD_PIDS[0]}" "${ETCD_PIDS[1]}"
  # The survivor loses its leader after its election timeout (1 s by default).
  for ((k = 0; k < 30; k++)); do
    doctor quorum "$survivor" && fail "doctor passed a cluster without quorum"
    grep -q "knows no leader" "$T/quorum.log" && break
    sleep 1
  done
  expect_in "$T/quorum.log" "[FAIL] etcd-cluster        $survivor knows no leader: the cluster has lost its quorum"
  expect_in "$T/quorum.log" "[FAIL] etcd-write"
  echo "PASS: ddprun doctor names a healthy etcd, a refused port, a peer port, two clusters and a lost quorum"
  ;;
cluster)
  start_etcd c 3 http
  # The leader first in --rdzv-endpoint: the agents talk to it, and losing it costs the
  # cluster an election too.
  leader=""
  for k in $(seq 100); do
    for i in 0 1 2; do grep -q "became leader" "$T/etcd-c-m$i.log" && leader=$i; done
    [[ -n "$leader" ]] && break
    sleep 0.1
  done
  [[ -n "$leader" ]] || fail "the etcd cluster elected no leader"
  endpoints="127.0.0.1:${ETCD_PORTS[leader]}"
  for i in 0 1 2; do [[ $i -ne $leader ]] && endpoints+=",127.0.0.1:${ETCD_PORTS[i]}"; done
  # Heartbeats every 2 s (a node is lost after 3 missed: 6 s), not FAST's 0.5 s: losing the
  # leader costs an election (etcd's election timeout is 1 s, randomized up to 2 s) during
  # which writes wait, and with 1.5 s of tolerance a loaded CI machine once declared a live
  # node lost (round 1); with 4.5 s, once in ten runs of the test under a parallel ctest here.
  # Production heartbeats are slower still (5 s).
  common=(--nnodes 2 --nproc-per-node 1 --max-restarts 0 --rdzv-backend etcd-v2
          --rdzv-endpoint "$endpoints" --rdzv-id cluster1
          --rdzv-conf "last_call_timeout=1,heartbeat=2,join_timeout=60" "$WORKER")
  start_agent a A "${common[@]}"; A=$LAST_PID
  start_agent b B "${common[@]}"; B=$LAST_PID
  wait_grep 60 "world=2" "$T/a.log" "$T/b.log"
  # Lose the leader while both agents heartbeat and watch through it.
  kill -9 "${ETCD_PIDS[leader]}"
  # Let the job run on for several heartbeat periods (the survivors elect a leader if the
  # lost member led), then let it end. Any change would start round 1.
  sleep 10
  touch "$T/done"
  wait_exit "$A" 60; ra=$?
  wait_exit "$B" 60; rb=$?
  [[ $ra -eq 0 && $rb -eq 0 ]] || fail "agents ended $ra and $rb, expected 0 and 0"
  expect_not_in "$T/a.log" "rendezvous round 1"
  expect_not_in "$T/b.log" "rendezvous round 1"
  echo "PASS: a 3-member etcd cluster lost a member mid-job; the job did not notice"
  ;;
netns)
  [[ $(id -u) -eq 0 ]] || { echo "SKIP: network namespaces need root"; exit 77; }
  command -v ip >/dev/null || { echo "SKIP: iproute2 (ip) is not installed"; exit 77; }
  NS_PREFIX="ddpe$$"
  NAMESPACES=()
  netns_cleanup() {
    for ns in "${NAMESPACES[@]}"; do ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null; done
    for ns in "${NAMESPACES[@]}"; do ip netns del "$ns" 2>/dev/null; done
    cleanup
  }
  trap netns_cleanup EXIT
  ip netns add "$NS_PREFIX-hub" && NAMESPACES+=("$NS_PREFIX-hub") || { echo "SKIP: cannot create network namespaces here"; exit 77; }
  ip -n "$NS_PREFIX-hub" link add br0 type bridge
  ip -n "$NS_PREFIX-hub" link set br0 up
  for i in 0 1 2; do  # 0: etcd, 1 and 2: the nodes
    ns="$NS_PREFIX-$i"
    ip netns add "$ns" && NAMESPACES+=("$ns") || fail "cannot create $ns"
    ip link add "ve$$-$i" netns "$NS_PREFIX-hub" type veth peer name rdzv0 netns "$ns" ||
      fail "cannot create the veth pair of $ns"
    ip -n "$NS_PREFIX-hub" link set "ve$$-$i" master br0 up
    ip -n "$ns" link set lo up
    ip -n "$ns" addr add "10.79.0.$((i + 1))/24" dev rdzv0
    ip -n "$ns" link set rdzv0 up
  done
  ip netns exec "$NS_PREFIX-0" "$ETCD" --name m0 --data-dir "$T/netns-m0" \
    --listen-client-urls http://10.79.0.1:2379 --advertise-client-urls http://10.79.0.1:2379 \
    --listen-peer-urls http://10.79.0.1:2380 --initial-advertise-peer-urls http://10.79.0.1:2380 \
    --initial-cluster m0=http://10.79.0.1:2380 >"$T/etcd-netns.log" 2>&1 &
  PIDS+=($!)
  wait_grep 60 "ready to serve client requests" "$T/etcd-netns.log"
  common=(--nnodes 1:2 --nproc-per-node 1 --max-restarts 0 --rdzv-backend etcd
          --rdzv-endpoint 10.79.0.1:2379 --rdzv-id netns1
          --rdzv-conf "$FAST,read_timeout=10,connect_timeout=3" "$WORKER")
  for n in 1 2; do
    ip netns exec "$NS_PREFIX-$n" env NODE_TAG=N$n DONE_FILE="$T/done" "$DDPRUN" "${common[@]}" \
      >"$T/node$n.log" 2>&1 &
    PIDS+=($!)
    eval "N$n=\$!"
  done
  wait_grep 60 "world=2" "$T/node1.log" "$T/node2.log"
  grep -h "WORKER" "$T/node1.log" "$T/node2.log" | grep "master=10.79.0.[23]" >/dev/null ||
    fail "MASTER_ADDR is not a node's address"
  ip -n "$NS_PREFIX-2" link set rdzv0 down
  wait_grep 60 "world=1" "$T/node1.log"
  expect_in "$T/node1.log" "missed 3 heartbeats"
  wait_exit "$N2" 90; r2=$?
  [[ $r2 -ne 0 ]] || fail "the cut-off node ended 0"
  grep -q "etcd" <(grep "error" "$T/node2.log") || fail "the cut-off node's error does not name etcd"
  touch "$T/done"
  wait_exit "$N1" 60; r1=$?
  [[ $r1 -eq 0 ]] || fail "node 1 ended $r1, expected 0"
  echo "PASS: etcd across network namespaces; a cut-off node is named and the job goes on"
  ;;
*)
  echo "unknown scenario $SCENARIO"
  exit 2
  ;;
esac
