#!/usr/bin/env bash
# All-reduce across hosts: every host is a network namespace with one veth link to a "switch"
# namespace (a bridge), each link shaped to LINK in both directions with tc tbf (netem, hence
# delay emulation, is not available in this kernel). Runs, per layout and link rate, float32
# sum all-reduce of each size for:
#   ddp       ddp's cpu backend (hierarchical: shared memory in a host, TCP among host leaders)
#   ddp_gloo  ddp's gloo backend (flat Gloo ring over all ranks)
#   gloo      PyTorch's torch.distributed on gloo ($PY: the .venv's PyTorch 2.13, bench/python.sh)
#   mpi       OpenMPI (ddp's mpi backend, TCP between hosts, shared memory within one), launched
#             across the namespaces by mpirun through an rsh agent that runs `ip netns exec`
# and prints one JSON line per measurement:
#   {"bench":"allreduce_hosts","impl":"ddp","nodes":2,"ranks_per_node":2,"bytes":16777216,
#    "busbw_gbps":0.17,"link_gbps":0.125}
# busbw = bytes x 2(n-1)/n / time with n = nodes x ranks_per_node (NCCL's definition); link_gbps
# is the shaped rate in GB/s. Each measurement is the median of 3 timed loops sized to about
# BUDGET_MS; ROUNDS repeats the whole matrix (then compare medians across rounds).
#
#   bench/allreduce/hosts.sh [BUILD_DIR]      (default: build; builds target allreduce_bench)
#
# Environment (to cut the matrix for quick runs):
#   LAYOUTS  "2x2 4x1"          hosts x ranks per host
#   LINKS    "1 10"             link rates in Gbit/s
#   IMPLS    "ddp ddp_gloo gloo mpi"
#   SIZES    65536,1048576,16777216,67108864
#   BUDGET_MS 1500              time per size and impl (plus one warm-up and one probe call)
#   ROUNDS   1
# Needs root (network namespaces); exits 77 with the reason otherwise. The namespaces are
# removed on exit, even on Ctrl-C.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../python.sh"  # PY: the interpreter with PyTorch 2.13
BUILD=${1:-$ROOT/build}
LAYOUTS=${LAYOUTS:-"2x2 4x1"}
LINKS=${LINKS:-"1 10"}
IMPLS=${IMPLS:-"ddp ddp_gloo gloo mpi"}
SIZES=${SIZES:-65536,1048576,16777216,67108864}
BUDGET_MS=${BUDGET_MS:-1500}
ROUNDS=${ROUNDS:-1}

skip() { echo "hosts.sh: skipped: $*" >&2; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (run as root)"
command -v ip >/dev/null || skip "iproute2 (ip) is not installed"
command -v tc >/dev/null || skip "tc (iproute2) is not installed"

cmake --build "$BUILD" --target allreduce_bench -j2 >/dev/null
BIN=$(find "$BUILD" -name allreduce_bench -type f -perm -u+x | head -1)
[ -x "$BIN" ] || { echo "allreduce_bench not found under $BUILD" >&2; exit 1; }

TAG=ddpah$$
SW=${TAG}sw
MAXHOSTS=4
NET=10.79.0
WORK=$(mktemp -d)
cleanup() {
  for ((h = 0; h < MAXHOSTS; h++)); do
    ip netns del "${TAG}h$h" 2>/dev/null || true
    rm -rf "/etc/netns/${TAG}h$h"
  done
  ip netns del "$SW" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- topology: hosts h0..h3, each 10.79.0.(h+1) on interface "ddph", all on one bridge -------
ip netns add "$SW" 2>/dev/null || skip "ip netns add failed (no CAP_SYS_ADMIN in this container?)"
ip -n "$SW" link add br0 type bridge
ip -n "$SW" link set br0 up
ip -n "$SW" link set lo up
for ((h = 0; h < MAXHOSTS; h++)); do
  ns=${TAG}h$h
  ip netns add "$ns"
  ip link add "${TAG}a$h" type veth peer name "${TAG}b$h"
  ip link set "${TAG}a$h" netns "$ns"
  ip link set "${TAG}b$h" netns "$SW"
  ip -n "$ns" link set "${TAG}a$h" name ddph
  ip -n "$SW" link set "${TAG}b$h" name "p$h"
  ip -n "$SW" link set "p$h" master br0
  ip -n "$SW" link set "p$h" up
  ip -n "$ns" addr add "$NET.$((h + 1))/24" dev ddph
  ip -n "$ns" link set ddph up
  ip -n "$ns" link set lo up
  # `ip netns exec` bind-mounts /etc/netns/NS/hosts over /etc/hosts: host names for mpirun.
  mkdir -p "/etc/netns/$ns"
  {
    echo "127.0.0.1 localhost"
    for ((k = 0; k < MAXHOSTS; k++)); do echo "$NET.$((k + 1)) ${TAG}h$k"; done
  } >"/etc/netns/$ns/hosts"
done

# Shapes every host's link to $1 Gbit/s in both directions (host -> switch on ddph, switch ->
# host on p<h>). The bucket holds about 2 ms at the rate (and at least 256 KB, above a GSO
# packet) so a timer tick does not throttle below the rate.
shape() {
  local gbit=$1 burst
  burst=$((gbit * 1000000000 / 8 / 500))
  ((burst < 262144)) && burst=262144
  for ((h = 0; h < MAXHOSTS; h++)); do
    ip netns exec "${TAG}h$h" tc qdisc replace dev ddph root tbf rate "${gbit}gbit" \
      burst "$burst" latency 20ms
    ip netns exec "$SW" tc qdisc replace dev "p$h" root tbf rate "${gbit}gbit" \
      burst "$burst" latency 20ms
  done
}

PORT=29600
next_port() { PORT=$((PORT + 1)); }

# Runs one rank per (host, local rank) with the torchrun environment; rank 0's stdout is the
# result. $1 nodes, $2 ranks per node, then the command.
launch_env() {
  local nodes=$1 rpn=$2; shift 2
  local world=$((nodes * rpn)) pids=() rc=0
  next_port
  for ((r = 0; r < world; r++)); do
    local h=$((r / rpn)) out=/dev/null
    ((r == 0)) && out=$WORK/rank0.out
    ip netns exec "${TAG}h$h" env RANK=$r WORLD_SIZE=$world LOCAL_RANK=$((r % rpn)) \
      LOCAL_WORLD_SIZE=$rpn GROUP_RANK=$h MASTER_ADDR=$NET.1 MASTER_PORT=$PORT \
      DDP_HOST_ID="${TAG}h$h" GLOO_SOCKET_IFNAME=ddph OMP_NUM_THREADS=1 \
      timeout 600 "$@" >"$out" 2>"$WORK/rank$r.err" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  if ((rc != 0)); then
    echo "hosts.sh: $* failed on ${nodes}x$rpn:" >&2
    cat "$WORK"/rank*.err >&2
  fi
  return $rc
}

# mpirun across namespaces: the rsh agent gets "<host> <command...>" and runs the command in
# that host's namespace with its own UTS namespace and host name, so OpenMPI sees distinct
# nodes (shared memory within a namespace, TCP between them).
AGENT=$WORK/netns-rsh
cat >"$AGENT" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host=\$1; shift
exec ip netns exec "\$host" unshare --uts sh -c "hostname \$host; \$*"
EOF
chmod +x "$AGENT"
MPI_OK=
if [[ " $IMPLS " == *" mpi "* ]]; then
  if ! command -v mpirun >/dev/null; then
    echo "hosts.sh: impl mpi skipped: mpirun not found" >&2
  elif ! "$BIN" --backends | grep -qx mpi; then
    echo "hosts.sh: impl mpi skipped: allreduce_bench was built without the mpi backend" >&2
  else
    MPI_OK=1
  fi
fi

launch_mpi() {
  local nodes=$1 rpn=$2; shift 2
  local hosts=""
  for ((h = 0; h < nodes; h++)); do hosts+="${hosts:+,}${TAG}h$h:$rpn"; done
  ip netns exec "${TAG}h0" unshare --uts sh -c "hostname ${TAG}h0; exec \"\$@\"" mpi \
    timeout 600 mpirun --allow-run-as-root --host "$hosts" -np $((nodes * rpn)) \
    --mca plm_rsh_agent "$AGENT" --mca btl self,vader,tcp \
    --mca btl_tcp_if_include ddph --mca oob_tcp_if_include ddph \
    -x OMP_NUM_THREADS=1 "$@" >"$WORK/rank0.out" 2>"$WORK/mpi.err" || {
    echo "hosts.sh: mpirun failed on ${nodes}x$rpn:" >&2
    cat "$WORK/mpi.err" >&2
    return 1
  }
}

# Converts rank 0's allreduce_bench lines into the allreduce_hosts format.
emit() {
  local impl=$1 nodes=$2 rpn=$3 gbit=$4
  $PY - "$WORK/rank0.out" "$impl" "$nodes" "$rpn" "$gbit" <<'PY'
import json, sys
path, impl, nodes, rpn, gbit = sys.argv[1:]
for line in open(path):
    if not line.startswith("{"):
        continue
    r = json.loads(line)
    print(json.dumps({"bench": "allreduce_hosts", "impl": impl, "nodes": int(nodes),
                      "ranks_per_node": int(rpn), "bytes": r["bytes"],
                      "busbw_gbps": r["busbw_gbps"],
                      "link_gbps": round(int(gbit) / 8, 4)}, separators=(",", ":")),
          flush=True)
PY
}

echo "hosts.sh: load before the run: $(uptime)" >&2
for ((round = 1; round <= ROUNDS; round++)); do
  for gbit in $LINKS; do
    shape "$gbit"
    for layout in $LAYOUTS; do
      nodes=${layout%x*}
      rpn=${layout#*x}
      ((nodes <= MAXHOSTS)) || { echo "hosts.sh: layout $layout: at most $MAXHOSTS hosts" >&2; exit 2; }
      for impl in $IMPLS; do
        rm -f "$WORK/rank0.out"
        case $impl in
          ddp) launch_env "$nodes" "$rpn" "$BIN" cpu --sizes "$SIZES" --budget-ms "$BUDGET_MS" ;;
          ddp_gloo) launch_env "$nodes" "$rpn" "$BIN" gloo --sizes "$SIZES" --budget-ms "$BUDGET_MS" ;;
          gloo) launch_env "$nodes" "$rpn" "$PY" "$ROOT/bench/allreduce/torch_allreduce.py" env \
                  "$SIZES" "$BUDGET_MS" ;;
          mpi) [ -n "$MPI_OK" ] || continue
               launch_mpi "$nodes" "$rpn" "$BIN" mpi --sizes "$SIZES" --budget-ms "$BUDGET_MS" ;;
          *) echo "hosts.sh: unknown impl '$impl' (ddp ddp_gloo gloo mpi)" >&2; exit 2 ;;
        esac || continue
        emit "$impl" "$nodes" "$rpn" "$gbit" | tee -a "$WORK/all.jsonl"
      done
    done
  done
done
echo "hosts.sh: load after the run: $(uptime)" >&2

# Summary at 16 MB: medians over the rounds, ddp against PyTorch's gloo, and the issue's targets
# at 2 hosts x 2 ranks (93% of the hierarchical bound 1.5 x link at 1 Gbit/s; 85% of the link
# rate at 10 Gbit/s).
[ -s "$WORK/all.jsonl" ] && $PY - "$WORK/all.jsonl" <<'PY'
import json, statistics, sys
from collections import defaultdict
rows = [json.loads(l) for l in open(sys.argv[1])]
med = defaultdict(list)
for r in rows:
    med[(r["impl"], r["nodes"], r["ranks_per_node"], r["bytes"], r["link_gbps"])].append(
        r["busbw_gbps"])
med = {k: statistics.median(v) for k, v in med.items()}
for (impl, nodes, rpn, nbytes, link), bw in sorted(med.items()):
    if impl != "ddp" or nbytes != 16 << 20:
        continue
    out = {"bench": "allreduce_hosts_summary", "nodes": nodes, "ranks_per_node": rpn,
           "bytes": nbytes, "link_gbps": link, "ddp_busbw_gbps": round(bw, 4)}
    for other in ("ddp_gloo", "gloo", "mpi"):
        o = med.get((other, nodes, rpn, nbytes, link))
        if o:
            out["ddp_over_" + other] = round(bw / o, 2)
    if nodes == 2 and rpn == 2:
        target = 0.93 * 1.5 * link if link < 1 else 0.85 * link
        out["target_busbw_gbps"] = round(target, 4)
        out["meets_target"] = bw >= target
    print(json.dumps(out, separators=(",", ":")))
PY
