#!/usr/bin/env bash
# In-process rendezvous load (rdzv_load: N agents as threads of one process), JSON lines on
# stdout: the TCP store at N = 1000 4000 10000, then etcd (a fresh single-member etcd started
# here on a free loopback port, killed at the end) at the ETCD_SIZES (default 1000 4000 10000),
# with a shard process per 1500 etcd agents (an etcd agent holds about 10 descriptors and one
# process may open 20000 here). Each run ends with IDLE_SECONDS (default 30; 0: none) of the
# job's steady state: every agent's MembershipWatcher at the default 5 s heartbeat, the store's
# requests per second and CPU (rdzv_load --idle-seconds). ETCD_HB_SECONDS=0 skips the etcd
# runs' heartbeat capacity phase (every agent writing in a loop, which one etcd refuses from
# thousands of agents: "too many requests"), so their steady state is measured at any size.
# Usage: run_rdzv_load.sh BUILD_DIR [TCP_SIZES...]   (TCP_SIZES "none": etcd only;
#        ETCD_SIZES="...", IDLE_SECONDS=S and ETCD_HB_SECONDS=D in the environment)
set -euo pipefail
BUILD="${1:?usage: run_rdzv_load.sh BUILD_DIR [TCP_SIZES...]}"
shift
TCP_SIZES=("${@:-1000 4000 10000}")
read -r -a TCP_SIZES <<<"${TCP_SIZES[*]}"
read -r -a ETCD_SIZES <<<"${ETCD_SIZES:-1000 4000 10000}"
LOAD="$BUILD/bench/rendezvous/rdzv_load"
IDLE=(--idle-seconds "${IDLE_SECONDS:-30}")

if [[ ${TCP_SIZES[0]} != none ]]; then
  for n in "${TCP_SIZES[@]}"; do "$LOAD" --store tcp --agents "$n" "${IDLE[@]}" 2>/dev/null; done
fi

command -v etcd >/dev/null || { echo "run_rdzv_load: etcd is not installed; skipping etcd" >&2; exit 0; }
dir=$(mktemp -d /tmp/rdzv-load-etcd.XXXXXX)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
peer=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
etcd --data-dir "$dir/data" --listen-client-urls "http://127.0.0.1:$port" \
  --advertise-client-urls "http://127.0.0.1:$port" --listen-peer-urls "http://127.0.0.1:$peer" \
  --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
  --initial-cluster "default=http://127.0.0.1:$peer" >"$dir/etcd.log" 2>&1 &
etcd_pid=$!
trap 'kill -9 $etcd_pid 2>/dev/null; wait $etcd_pid 2>/dev/null; rm -rf "$dir"' EXIT
for ((k = 0; k < 600; k++)); do
  grep -q "ready to serve client requests" "$dir/etcd.log" && break
  sleep 0.1
done
for n in "${ETCD_SIZES[@]}"; do
  "$LOAD" --store etcd --etcd "127.0.0.1:$port" --store-pid "$etcd_pid" --agents "$n" \
    --shards $(((n + 1499) / 1500)) --hb-seconds "${ETCD_HB_SECONDS:-3}" "${IDLE[@]}" 2>"$dir/load-$n.err" || sed 's/^/  /' "$dir/load-$n.err" >&2
  sleep 60  # the previous run's connections leave TIME_WAIT
done
