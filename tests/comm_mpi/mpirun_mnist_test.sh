#!/usr/bin/env bash
# A Horovod-style launch: `mpirun -np 2 mnist` with no MASTER_ADDR/MASTER_PORT and the default
# backend trains, because init_process_group bootstraps the store through MPI, and rank 0 says
# so in one log line.
#
# Usage: mpirun_mnist_test.sh MNIST. Exit 77 (ctest: skipped) when mpirun or the dataset is
# absent.
set -euo pipefail
MNIST="${1:?usage: mpirun_mnist_test.sh MNIST}"
command -v mpirun >/dev/null 2>&1 || { echo "SKIP: mpirun not found (Debian package openmpi-bin)"; exit 77; }
[[ -d /usr/share/datasets/fashion-mnist ]] ||
  { echo "SKIP: no Fashion-MNIST (Debian package dataset-fashion-mnist)"; exit 77; }
fail() { echo "FAIL: $*"; echo "---- output"; echo "$out"; exit 1; }

unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK
out=$(timeout 240 mpirun -np 2 --allow-run-as-root --oversubscribe --tag-output \
        "$MNIST" --epochs 1 --max-steps 30 --test-images 1000 2>&1) ||
  fail "mpirun exited non-zero or ran over 240 s"
echo "$out"
[[ $(grep -c 'started by mpirun without MASTER_ADDR/MASTER_PORT: rank 0 hosts the store at 127.0.0.1:[0-9]* and sent that address to the 2 ranks over MPI' <<<"$out") -eq 1 ]] ||
  fail "expected rank 0's one log line about the MPI bootstrap"
grep -q 'samples/s over 2 ranks | test accuracy' <<<"$out" || fail "training did not finish over 2 ranks"
echo "PASS: mpirun -np 2 trained without MASTER_ADDR"
