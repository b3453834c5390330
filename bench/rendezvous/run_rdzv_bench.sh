#!/usr/bin/env bash
# Rendezvous benchmark, JSON lines on stdout:
#   ddprun: N = 64, 256, 1024 agents (rdzv_bench; see rdzv_bench.cpp for the definitions of
#           total_s, spawn_s, after_last_start_s and exit_s)
#   torchrun: N = 4, 8 agents of PyTorch's torchrun (c10d, --no-python /bin/true), first start
#           to every agent exited ("exit_s"), next to ddprun's exit_s at the same N;
#           TORCHRUN_SIZES="16 32" for others (each torchrun agent is a Python process with
#           PyTorch imported: about 0.3 GB and 2-3 s of CPU, so this machine's memory bounds N)
# Usage: run_rdzv_bench.sh BUILD_DIR [SIZES...]   (SIZES "none": only the torchrun comparison)
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../python.sh"  # PY: the interpreter with PyTorch 2.13
BUILD="${1:?usage: run_rdzv_bench.sh BUILD_DIR [SIZES...]}"
shift
SIZES=("${@:-64 256 1024}")
read -r -a SIZES <<<"${SIZES[*]}"
DDPRUN="$BUILD/apps/ddprun/ddprun"
BENCH="$BUILD/bench/rendezvous/rdzv_bench"
ulimit -n "$(ulimit -Hn)"

if [[ ${SIZES[0]} != none ]]; then
  for n in "${SIZES[@]}"; do
    "$BENCH" --ddprun "$DDPRUN" --agents "$n" --repeat 2
  done
fi
read -r -a TORCHRUN_SIZES <<<"${TORCHRUN_SIZES:-4 8}"

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }
for n in "${TORCHRUN_SIZES[@]}"; do
  for impl in torchrun ddprun; do
    port=$(free_port)
    logs=$(mktemp -d)
    t0=$(now)
    pids=()
    for ((i = 0; i < n; i++)); do
      if [[ $impl == torchrun ]]; then
        # torch 1.13 spells its flags with underscores only.
        "$PY" -m torch.distributed.run --nnodes "$n" --nproc_per_node 1 \
          --rdzv_backend c10d --rdzv_endpoint "127.0.0.1:$port" --rdzv_id "b$n" \
          --redirects 1 --tee 1 --log_dir "$logs/$i" --no_python /bin/true >/dev/null 2>&1 &
      else
        "$DDPRUN" --nnodes "$n" --nproc-per-node 1 --rdzv-backend c10d \
          --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "b$n" --no-python /bin/true \
          >/dev/null 2>&1 &
      fi
      pids+=($!)
    done
    rc=0
    for p in "${pids[@]}"; do wait "$p" || rc=1; done
    t1=$(now)
    rm -rf "$logs"
    printf '{"bench":"rendezvous","impl":"%s","agents":%d,"exit_s":%.3f,"ok":%s}\n' \
      "$impl" "$n" "$(echo "$t1 - $t0" | bc)" "$([[ $rc == 0 ]] && echo true || echo false)"
  done
done
