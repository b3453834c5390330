#!/usr/bin/env bash
# DDP across hosts: the tutorial's CNN (examples/mnist, batch 64 per rank) on 2 hosts x 1 rank,
# each host a network namespace, the two joined by one veth link shaped to LINK Gbit/s in both
# directions with tc tbf. Runs, per round, interleaved:
#   ddp      examples/mnist under ddprun (static 2-node rendezvous), cpu backend, with the plain
#            all-reduce hook and with the fp16 compression hook
#   pytorch  examples/mnist/mnist.py under torchrun (PyTorch DDP on gloo), with and without its
#            fp16_compress_hook
#   one host ddp's mnist, 2 ranks in one namespace (shared memory: the yardstick; the CPU is
#            the same 2 cores either way, so only the link differs)
# and prints one JSON line per run:
#   {"bench":"mnist_hosts","impl":"ddp","hosts":2,"ranks_per_host":1,"comm_hook":"fp16",
#    "link_gbps":0.125,"batch_per_rank":64,"max_steps":200,"samples_per_s":1800.0}
# then a summary line with medians over rounds and the ratios to ddp's one-host run, and one
# step of ddp's 2-host timeline (allreduce hook) with its spans in ms from the step's start.
#
#   bench/ddp/hosts_mnist.sh [BUILD_DIR] [MAX_STEPS=200] [ROUNDS=3]
# Environment: LINK (Gbit/s, default 1). Needs root (namespaces); exits 77 otherwise.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$(dirname "${BASH_SOURCE[0]}")/../python.sh"  # PY: the interpreter with PyTorch 2.13
BUILD=${1:-$ROOT/build}
MAX_STEPS=${2:-200}
ROUNDS=${3:-3}
LINK=${LINK:-1}
BATCH=64
DDPRUN=$BUILD/apps/ddprun/ddprun
MNIST=$BUILD/examples/mnist/mnist

skip() { echo "hosts_mnist.sh: skipped: $*" >&2; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root to create network namespaces (run as root)"
command -v tc >/dev/null || skip "tc (iproute2) is not installed"
for b in "$DDPRUN" "$MNIST"; do
  [ -x "$b" ] || { echo "hosts_mnist.sh: $b not built (targets ddprun mnist)" >&2; exit 1; }
done
[ -x "$TORCHRUN" ] || skip "$TORCHRUN missing (scripts/install-deps.sh makes .venv/ with torch)"

TAG=ddpmh$$
NET=10.77.0
WORK=$(mktemp -d)
cleanup() {
  ip netns del "${TAG}h0" 2>/dev/null || true
  ip netns del "${TAG}h1" 2>/dev/null || true
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

ip netns add "${TAG}h0" || skip "ip netns add failed (no CAP_SYS_ADMIN in this container?)"
ip netns add "${TAG}h1"
ip link add "${TAG}a" netns "${TAG}h0" type veth peer name "${TAG}b" netns "${TAG}h1"
for h in 0 1; do
  ns=${TAG}h$h
  dev=${TAG}a
  ((h == 1)) && dev=${TAG}b
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$NET.$((h + 1))/24" dev "$dev"
  ip -n "$ns" link set "$dev" up
  # About 2 ms of the rate in the bucket (at least 256 KB, above a GSO packet).
  burst=$((LINK * 1000000000 / 8 / 500))
  ((burst < 262144)) && burst=262144
  ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "${LINK}gbit" burst "$burst" \
    latency 20ms
done
IFACE_OF=("${TAG}a" "${TAG}b")

load1() { cut -d' ' -f1 /proc/loadavg; }
rate_of() {  # the samples/s of a "Training time" line in the given file
  grep -o 'Training time = .*samples/s' "$1" | grep -o '[0-9.]* samples/s' | grep -o '^[0-9.]*' |
    head -1
}
emit() {  # emit IMPL HOSTS RPH HOOK RATE (nothing while EMIT=0: the timeline runs)
  [ "${EMIT:-1}" = 1 ] || return 0
  printf '{"bench":"mnist_hosts","impl":"%s","hosts":%s,"ranks_per_host":%s,"comm_hook":"%s","link_gbps":%s,"batch_per_rank":%s,"max_steps":%s,"samples_per_s":%s,"load1":%s}\n' \
    "$1" "$2" "$3" "$4" "$($PY -c "print(round($LINK / 8, 4))")" "$BATCH" "$MAX_STEPS" "$5" \
    "$(load1)" | tee -a "$WORK/rows"
}

PORT=29700
# Two agents, one per namespace; rank 0's output into $WORK/out. Args: impl hook [extra...]
two_hosts() {
  local impl=$1 hook=$2
  shift 2
  PORT=$((PORT + 1))
  local pids=() rc=0
  for h in 0 1; do
    local env=(env GLOO_SOCKET_IFNAME="${IFACE_OF[h]}" DDP_HOST_ID="${TAG}h$h" OMP_NUM_THREADS=1)
    if [ "$impl" = ddp ]; then
      ip netns exec "${TAG}h$h" "${env[@]}" timeout 600 "$DDPRUN" --nnodes 2 --node-rank "$h" \
        --nproc-per-node 1 --master-addr "$NET.1" --master-port "$PORT" "$MNIST" \
        --batch-size "$BATCH" --max-steps "$MAX_STEPS" --comm-hook "$hook" "$@" \
        >"$WORK/out$h" 2>&1 &
    else
      ip netns exec "${TAG}h$h" "${env[@]}" timeout 600 "$TORCHRUN" --nnodes 2 \
        --node_rank "$h" --nproc_per_node 1 --master_addr "$NET.1" --master_port "$PORT" \
        --redirects 1 --tee 1 --log_dir "$WORK/torchrun.$PORT.$h" \
        "$ROOT/examples/mnist/mnist.py" --batch-size "$BATCH" --max-steps "$MAX_STEPS" \
        --comm-hook "$hook" >"$WORK/out$h" 2>&1 &
    fi
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  local rate
  rate=$(rate_of "$WORK/out0" || true)
  if ((rc != 0)) || [ -z "$rate" ]; then
    echo "hosts_mnist.sh: $impl ($hook) across 2 hosts failed:" >&2
    tail -20 "$WORK/out0" "$WORK/out1" >&2
    exit 1
  fi
  emit "$impl" 2 1 "$hook" "$rate"
}
one_host() {
  ip netns exec "${TAG}h0" env OMP_NUM_THREADS=1 timeout 600 "$DDPRUN" --standalone \
    --nproc-per-node 2 "$MNIST" --batch-size "$BATCH" --max-steps "$MAX_STEPS" >"$WORK/out0" 2>&1 ||
    { echo "hosts_mnist.sh: one-host run failed:" >&2; tail -20 "$WORK/out0" >&2; exit 1; }
  emit ddp 1 2 allreduce "$(rate_of "$WORK/out0")"
}

echo "hosts_mnist.sh: load before the run: $(uptime)" >&2
for ((round = 1; round <= ROUNDS; round++)); do
  one_host
  two_hosts ddp allreduce
  two_hosts ddp fp16
  two_hosts pytorch allreduce
  two_hosts pytorch fp16
done
# One more ddp run per hook with the timeline, for one step's picture (not in the figures).
for hook in allreduce fp16; do
  EMIT=0 two_hosts ddp "$hook" --timeline "$WORK/timeline.$hook.{rank}.json"
done

$PY - "$WORK/rows" "$WORK/timeline.allreduce.0.json" "$WORK/timeline.fp16.0.json" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
def med(impl, hosts, hook):
    v = [r["samples_per_s"] for r in rows
         if r["impl"] == impl and r["hosts"] == hosts and r["comm_hook"] == hook]
    return statistics.median(v) if v else None
one = med("ddp", 1, "allreduce")
s = {"bench": "mnist_hosts_summary", "rounds": len([r for r in rows if r["hosts"] == 1]),
     "link_gbps": rows[0]["link_gbps"], "ddp_one_host": one}
for impl in ("ddp", "pytorch"):
    for hook in ("allreduce", "fp16"):
        s[f"{impl}_{hook}"] = med(impl, 2, hook)
s["ddp_allreduce_of_one_host"] = round(s["ddp_allreduce"] / one, 3)
s["ddp_fp16_of_one_host"] = round(s["ddp_fp16"] / one, 3)
s["target_allreduce_of_one_host"] = 0.8
s["target_fp16_of_one_host"] = 0.9
s["ddp_over_pytorch_allreduce"] = round(s["ddp_allreduce"] / s["pytorch_allreduce"], 2)
s["ddp_over_pytorch_fp16"] = round(s["ddp_fp16"] / s["pytorch_fp16"], 2)
print(json.dumps(s))
# One step in the middle of each run: the spans from one forward to the next, in ms.
for hook, path in (("allreduce", sys.argv[2]), ("fp16", sys.argv[3])):
    ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
    fwd = sorted(e["ts"] for e in ev if e["name"] == "forward")
    if len(fwd) < 3:
        continue
    t0, t1 = fwd[len(fwd) // 2], fwd[len(fwd) // 2 + 1]
    print(f"one step of rank 0 across 2 hosts ({hook} hook), {(t1 - t0) / 1000:.1f} ms:")
    for e in sorted((e for e in ev if t0 <= e["ts"] < t1), key=lambda e: e["ts"]):
        track = "comm   " if e.get("cat") == "comm" else "compute"
        print(f"  {track} {(e['ts'] - t0) / 1000:7.2f} .. {(e['ts'] + e['dur'] - t0) / 1000:7.2f}"
              f" ms  {e['name']}")
PY
