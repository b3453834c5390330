#!/usr/bin/env bash
# OpenMPI detection under a real mpirun: 2 processes of ddp-detect on this machine must both
# detect OpenMPI, one node, and warn that mpirun started 2 processes on the node; MASTER_ADDR
# passed with -x becomes the master.
#
# Usage: mpirun_detect_test.sh DDP_DETECT. Exit 77 (ctest: skipped) when mpirun is absent.
set -euo pipefail
DETECT="${1:?usage: mpirun_detect_test.sh DDP_DETECT}"
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
