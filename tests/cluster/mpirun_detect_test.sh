#!/usr/bin/env bash
# OpenMPI detection under a real mpirun: 2 processes of ddp-detect on this machine must both
# detect OpenMPI, one node, and warn that mpirun started 2 processes on the node; MASTER_ADDR
# passed with -x becomes the master.
#
# With DDPRUN, also runs the deploy templates that use mpirun as written: mpirun-hostfile.sh
# with a one-host hostfile, and pbs.qsub in a PBS-like environment (PBS_NODEFILE etc.).
#
# Usage: mpirun_detect_test.sh DDP_DETECT [DDPRUN]. Exit 77 (ctest: skipped) when mpirun is
# absent.
set -euo pipefail
DETECT="${1:?usage: mpirun_detect_test.sh DDP_DETECT [DDPRUN]}"
DDPRUN="${2:-}"
DEPLOY="$(dirname "$(realpath "$0")")/../../deploy"
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found (Debian package openmpi-bin)"; exit 77; }
fail() { echo "FAIL: $*"; echo "---- output"; echo "$out"; exit 1; }

export MASTER_ADDR=127.0.0.1
out=$(timeout 60 mpirun -np 2 --allow-run-as-root --oversubscribe -x MASTER_ADDR "$DETECT" 2>&1) ||
  fail "mpirun exited non-zero or ran over 60 s"
echo "$out"
[[ $(grep -c '"source":"openmpi"' <<<"$out") -eq 2 ]] || fail "expected 2 processes detecting OpenMPI"
[[ $(grep -c '"nnodes":1,"node_rank":0' <<<"$out") -eq 2 ]] || fail "expected 1 node, node rank 0"
[[ $(grep -c '"master_addr":"127.0.0.1"' <<<"$out") -eq 2 ]] || fail "MASTER_ADDR not used as master"
[[ $(grep -c 'mpirun started 2 processes on this node' <<<"$out") -eq 2 ]] || fail "no warning about 2 processes per node"
grep -q '"run_id":"[0-9]' <<<"$out" || fail "no run id from OpenMPI's job id"

# One process per node (the intended use): no warning, node rank = MPI rank.
unset MASTER_ADDR
out=$(timeout 60 mpirun -np 1 --allow-run-as-root "$DETECT" --explain 2>&1) ||
  fail "mpirun -np 1 failed"
echo "$out"
grep -q '^using OpenMPI: job [0-9]*, 1 node, this is node 0, master unknown (pass --master-addr or set MASTER_ADDR)$' <<<"$out" ||
  fail "unexpected explanation"
echo "PASS: mpirun detection"

[[ -n "$DDPRUN" && -x "$DDPRUN" ]] || exit 0
DDPRUN=$(realpath "$DDPRUN")  # pbs.qsub changes directory
T=$(mktemp -d /tmp/ddp-mpirun-XXXXXX)
trap 'rm -rf "$T"' EXIT
printf '#!/bin/sh\necho "worker RANK=$RANK WORLD_SIZE=$WORLD_SIZE"\n' >"$T/worker.sh"
chmod +x "$T/worker.sh"
echo "localhost slots=1" >"$T/hosts.txt"
MASTER_PORT=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export DDPRUN PROGRAM="$T/worker.sh" NPROC_PER_NODE=2 MPIRUN_ARGS=--allow-run-as-root MASTER_PORT
out=$(HOSTFILE="$T/hosts.txt" timeout 60 bash "$DEPLOY/mpirun-hostfile.sh" 2>&1) ||
  fail "deploy/mpirun-hostfile.sh failed"
echo "$out"
grep -q 'worker RANK=0 WORLD_SIZE=2' <<<"$out" && grep -q 'worker RANK=1 WORLD_SIZE=2' <<<"$out" ||
  fail "deploy/mpirun-hostfile.sh did not run 2 workers"

printf 'localhost\nlocalhost\n' >"$T/nodefile"
out=$(PBS_NODEFILE="$T/nodefile" PBS_JOBID=42.pbs PBS_O_WORKDIR="$T" VENV="" \
  timeout 60 bash "$DEPLOY/pbs.qsub" 2>&1) || fail "deploy/pbs.qsub failed"
echo "$out"
grep -q 'job 42.pbs: 1 nodes, master localhost' <<<"$out" || fail "pbs.qsub misread PBS_NODEFILE"
grep -q 'worker RANK=1 WORLD_SIZE=2' <<<"$out" || fail "deploy/pbs.qsub did not run 2 workers"
echo "PASS: deploy templates for mpirun and PBS"
