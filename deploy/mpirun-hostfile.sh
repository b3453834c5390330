#!/bin/bash
# ddp on machines without a scheduler: mpirun starts one ddprun per host of a hostfile
# (docs/cluster.md). Edit the variables below, then: bash mpirun-hostfile.sh
# The hostfile lists one host per line ("node1" or "node1 slots=1"); the first is the master.

# ---- edit these -----------------------------------------------------------------------
HOSTFILE=${HOSTFILE:-hosts.txt}
DDPRUN=${DDPRUN:-ddprun}                     # same path on every host
NPROC_PER_NODE=${NPROC_PER_NODE:-1}          # workers per host
PROGRAM=${PROGRAM:-python3 train.py --epochs 10}
MASTER_PORT=${MASTER_PORT:-29500}
MPIRUN_ARGS=${MPIRUN_ARGS:-}                 # extra mpirun flags (e.g. --allow-run-as-root)
# ---------------------------------------------------------------------------------------
set -euo pipefail

[[ -r "$HOSTFILE" ]] || { echo "cannot read HOSTFILE=$HOSTFILE: create it (one host per line)" >&2; exit 2; }
# Hosts: first word of each non-empty, non-comment line.
mapfile -t HOSTS < <(awk 'NF && $1 !~ /^#/ {print $1}' "$HOSTFILE" | awk '!seen[$0]++')
(( ${#HOSTS[@]} > 0 )) || { echo "HOSTFILE=$HOSTFILE lists no hosts" >&2; exit 2; }
MASTER_ADDR=${MASTER_ADDR:-${HOSTS[0]}}
DDP_STORE_TOKEN=${DDP_STORE_TOKEN:-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')}
export MASTER_ADDR MASTER_PORT DDP_STORE_TOKEN

echo "${#HOSTS[@]} hosts, master $MASTER_ADDR:$MASTER_PORT, $NPROC_PER_NODE workers per host"
# shellcheck disable=SC2086
mpirun --hostfile "$HOSTFILE" -np "${#HOSTS[@]}" --map-by ppr:1:node $MPIRUN_ARGS \
  -x MASTER_ADDR -x MASTER_PORT -x DDP_STORE_TOKEN -x PATH ${LD_LIBRARY_PATH:+-x LD_LIBRARY_PATH} \
  "$DDPRUN" --nproc-per-node "$NPROC_PER_NODE" $PROGRAM
