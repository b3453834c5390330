#!/usr/bin/env bash
# In-process rendezvous load (rdzv_load: N agents as threads of one process), JSON lines on
# stdout: the TCP store at N = 1000 4000 10000, then etcd (a fresh single-member etcd started
# here on a free loopback port, killed at the end) at the ETCD_SIZES (default 1000 4000 10000),
# with a shard process per 750 etcd agents (an etcd agent holds 18 descriptors once its watcher
# runs: 4 connections and 7 socket pairs of curl multi handles, more while it fails over between
# members; one process may open 20000 here; until 2026-11-27 one per 1500, which 1333 agents
# per shard outgrew). Each run ends with IDLE_SECONDS (default 30; 0: none) of the
# job's steady state: every agent's MembershipWatcher at the default 5 s heartbeat, the store's
# requests per second and CPU (rdzv_load --idle-seconds). ETCD_HB_SECONDS=0 skips the etcd
# runs' heartbeat capacity phase (every agent writing in a loop, which one etcd refuses from
# thousands of agents: "too many requests"), so their steady state is measured at any size.
# ETCD_MEMBERS=3 (default 1) starts a cluster of that many etcd members instead, each its own
# process, client and peer port and data dir on loopback; rdzv_load gets every member's client
# URL (agent i starts at member i % M) and every member's pid (store figures summed, and per
# member: member_rss_mb, member_connections, idle_member_cpu_pct). ETCD_ELECTION_MS=E (default:
# etcd's 1000 ms, heartbeat 100 ms) sets the members' --election-timeout E and
# --heartbeat-interval E/10: on cores shared with thousands of agent threads the leader's
# heartbeats come late and the members hold elections (README, "3-member etcd").
# AGENTS_PRIORITY (etcd runs only) runs the agents (rdzv_load and its shards) at a lower
# scheduling priority than the etcd members, which then get the shared cores first, as a cluster
# on machines of its own would (README, "10,000 agents on etcd"): "nice" (nice 19) or "idle"
# (SCHED_IDLE: the agents run only on cores etcd leaves idle); unset: the same priority. The JSON
# line reports it (agents_priority). KEY_TTL=T (etcd runs) sets the run lease's TTL (--rdzv-conf
# key_ttl: every agent renews it every T/3 s; default 30); HEARTBEAT=H the idle phase's
# heartbeat (default 5 s).
# Usage: run_rdzv_load.sh BUILD_DIR [TCP_SIZES...]   (TCP_SIZES "none": etcd only;
#        ETCD_SIZES, ETCD_MEMBERS, ETCD_ELECTION_MS, AGENTS_PRIORITY, KEY_TTL, HEARTBEAT,
#        IDLE_SECONDS and ETCD_HB_SECONDS in the environment)
set -euo pipefail
BUILD="${1:?usage: run_rdzv_load.sh BUILD_DIR [TCP_SIZES...]}"
shift
TCP_SIZES=("${@:-1000 4000 10000}")
read -r -a TCP_SIZES <<<"${TCP_SIZES[*]}"
read -r -a ETCD_SIZES <<<"${ETCD_SIZES:-1000 4000 10000}"
LOAD="$BUILD/bench/rendezvous/rdzv_load"
IDLE=(--idle-seconds "${IDLE_SECONDS:-30}" --heartbeat "${HEARTBEAT:-5}")
ETCD_CONF=()
[[ -n ${KEY_TTL:-} ]] && ETCD_CONF=(--key-ttl "$KEY_TTL")

if [[ ${TCP_SIZES[0]} != none ]]; then
  for n in "${TCP_SIZES[@]}"; do "$LOAD" --store tcp --agents "$n" "${IDLE[@]}" 2>/dev/null; done
fi

command -v etcd >/dev/null || { echo "run_rdzv_load: etcd is not installed; skipping etcd" >&2; exit 0; }
dir=$(mktemp -d /tmp/rdzv-load-etcd.XXXXXX)
members=${ETCD_MEMBERS:-1}
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
ports=() peers=() names=() cluster=()
for ((m = 0; m < members; m++)); do
  ports+=("$(free_port)") peers+=("$(free_port)")
  # One member keeps the name it always had ("default"); a cluster's are m0, m1, ...
  names+=("$([[ $members == 1 ]] && echo default || echo "m$m")")
  cluster+=("${names[m]}=http://127.0.0.1:${peers[m]}")
done
raft=()
[[ -n ${ETCD_ELECTION_MS:-} ]] &&
  raft=(--election-timeout "$ETCD_ELECTION_MS" --heartbeat-interval $((ETCD_ELECTION_MS / 10)))
pids=()
# (|| true: under set -e a killed member's status, 137, would end the trap before the rm)
trap 'kill -9 ${pids[*]:-} 2>/dev/null; wait ${pids[*]:-} 2>/dev/null || true; rm -rf "$dir"' EXIT
for ((m = 0; m < members; m++)); do
  etcd --name "${names[m]}" --data-dir "$dir/data$m" \
    --listen-client-urls "http://127.0.0.1:${ports[m]}" \
    --advertise-client-urls "http://127.0.0.1:${ports[m]}" \
    --listen-peer-urls "http://127.0.0.1:${peers[m]}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${peers[m]}" \
    --initial-cluster "$(IFS=,; echo "${cluster[*]}")" --initial-cluster-state new \
    --initial-cluster-token "rdzv-load-$$" "${raft[@]}" >"$dir/etcd$m.log" 2>&1 &
  pids+=($!)
done
# Each member says so once the cluster has a leader and it has joined (a quorum is needed).
for ((m = 0; m < members; m++)); do
  for ((k = 0; k < 600; k++)); do
    grep -qs "ready to serve client requests" "$dir/etcd$m.log" && break
    sleep 0.1
  done
  grep -q "ready to serve client requests" "$dir/etcd$m.log" || {
    echo "run_rdzv_load: etcd member $m did not start:" >&2
    tail -5 "$dir/etcd$m.log" >&2
    exit 1
  }
done
case "${AGENTS_PRIORITY:-}" in
"") priority=() ;;
nice) priority=(nice -n 19) ;;
idle) priority=(chrt --idle 0) ;;
*) echo "run_rdzv_load: AGENTS_PRIORITY is 'nice' or 'idle', not '$AGENTS_PRIORITY'" >&2; exit 2 ;;
esac
endpoints=$(IFS=,; echo "${ports[*]/#/127.0.0.1:}")
store_pids=$(IFS=,; echo "${pids[*]}")
for n in "${ETCD_SIZES[@]}"; do
  "${priority[@]}" "$LOAD" --store etcd --etcd "$endpoints" --store-pid "$store_pids" --agents "$n" \
    --shards $(((n + 749) / 750)) --hb-seconds "${ETCD_HB_SECONDS:-3}" "${IDLE[@]}" "${ETCD_CONF[@]}" \
    2>"$dir/load-$n.err" || {
    sed 's/^/  /' "$dir/load-$n.err" >&2
    for ((m = 0; m < members; m++)); do  # what etcd said last (its log goes with $dir)
      echo "  etcd member $m (pid ${pids[m]}), last lines of its log:" >&2
      tail -5 "$dir/etcd$m.log" | sed 's/^/    /' >&2
    done
  }
  sleep 60  # the previous run's connections leave TIME_WAIT
done
