#!/usr/bin/env bash
# Kubernetes job systems, replayed: each pod of a job is a network-namespace host (netns_lib.sh)
# that runs ddprun exactly as the manifest in deploy/kubernetes/ says (its `command:` line, the
# trainer in place of /workspace/train.py), in exactly the environment the operator injects
# into that pod (from the operators' source, cited per scenario: names, values, which pod gets
# which rank), with nothing inherited (env -i), and the pods' DNS names mapped in each host's
# /etc/hosts (ip netns exec binds /etc/netns/<namespace>/hosts there). The world must form and
# train: every rank reaches the last step with the expected world size.
#
#   k8s_operators_test.sh SCENARIO DDPRUN DEPLOY_DIR PYTHON PYTHONPATH TESTS_DIR
#   pytorchjob          Kubeflow PyTorchJob, master + 2 workers (training-operator v1.9,
#                       pkg/controller.v1/pytorch/envvar.go, master.go)
#   pytorchjob-elastic  PyTorchJob with an elasticPolicy, 2 workers (elastic.go)
#   trainjob            Kubeflow Trainer TrainJob, 2 nodes (kubeflow/trainer at a55f03a8c,
#                       pkg/runtime/framework/plugins/torch/torch.go)
#   jobset              a plain JobSet, 2 pods of an indexed Job (the manifest's own env)
#   volcano             Volcano job with the pytorch plugin, master + worker
#                       (pkg/controllers/job/plugins/distributed-framework/pytorch/pytorch.go)
# PYTHON has torch; PYTHONPATH holds the build's ddp package (the recovery scenarios' trainer,
# tests/python/recovery_worker.py, uses ddp.StepManager); TESTS_DIR is the source tests/.
set -uo pipefail

SCENARIO="${1:?usage: k8s_operators_test.sh SCENARIO DDPRUN DEPLOY_DIR PYTHON PYTHONPATH TESTS_DIR}"
DDPRUN="${2:?}"
DEPLOY="${3:?}"
PY="${4:?}"
POD_PYTHONPATH="${5:?}"
TESTS="${6:?}"

# shellcheck source=../rendezvous/netns_lib.sh
source "$TESTS/rendezvous/netns_lib.sh"

STEPS=8

# manifest_args FILE: the arguments of the manifest's ddprun command (its first `command:` line,
# a flow sequence, which is JSON), one per line, without "ddprun" and the trainer path.
manifest_args() {
  "$PY" - "$1" <<'PY'
import json, re, sys
for line in open(sys.argv[1]):
    m = re.match(r'\s*command:\s*(\[.*\])\s*$', line)
    if m:
        cmd = json.loads(m.group(1))
        assert cmd[0] == "ddprun" and cmd[-1] == "/workspace/train.py", cmd
        print("\n".join(cmd[1:-1]))
        break
else:
    sys.exit(f"{sys.argv[1]}: no command line")
PY
}

# read_manifest FILE: ARGS = the manifest's ddprun arguments.
read_manifest() {
  local text
  text=$(manifest_args "$1") || fail "cannot read the ddprun command of $1"
  mapfile -t ARGS <<<"$text"
  echo "$(basename "$1"): ddprun ${ARGS[*]} <trainer>"
}

# map_hosts NAME...: in every pod's host, NAME i resolves to pod i's address (10.78.0.i+1).
map_hosts() {
  local hosts="" i=0
  for name in "$@"; do
    hosts+="10.78.0.$((i + 1)) $name ${name%%.*}"$'\n'
    i=$((i + 1))
  done
  for ((i = 0; i < $#; i++)); do
    mkdir -p "/etc/netns/$(ns_of "$i")"
    printf '127.0.0.1 localhost\n%s' "$hosts" >"/etc/netns/$(ns_of "$i")/hosts"
  done
}

# start_pod NODE HOSTNAME TRAINER... : ddprun in pod NODE with the manifest's arguments (ARGS),
# the operator's variables (POD_ENV) and nothing else but what every pod has.
start_pod() {
  local node=$1 host=$2
  shift 2
  ip netns exec "$(ns_of "$node")" env -i PATH="$(dirname "$PY"):/usr/local/bin:/usr/bin:/bin" \
    HOME=/root HOSTNAME="$host" KUBERNETES_SERVICE_HOST=10.96.0.1 KUBERNETES_SERVICE_PORT=443 \
    PYTHONPATH="$POD_PYTHONPATH" GLOO_SOCKET_IFNAME=rdzv0 DDP_TEST_STEP_SLEEP_MS=50 \
    "${POD_ENV[@]}" "$DDPRUN" "${ARGS[@]}" "$@" >"$T/pod$node.log" 2>&1 &
  echo "pod $node ($host): ${POD_ENV[*]} ddprun ${ARGS[*]} $*" >>"$T/pods.txt"
  AGENT_PIDS+=($!)
  pids[node]=$!
}

# The trainer in place of /workspace/train.py: with --recovery step, PyTorch DDP under
# ddp.StepManager; without, a gloo all-reduce loop (env:// only).
trainer() {
  # No `printf ... | grep -q` here: grep -q exits at its first match, and under pipefail a
  # printf that writes after that (SIGPIPE) failed the test (in CI, the two pods of one job
  # once ran different trainers).
  local arg recovery=0
  for arg in "${ARGS[@]}"; do [[ "$arg" == --recovery ]] && recovery=1; done
  if ((recovery)); then
    mkdir -p "$T/out"
    echo "$TESTS/python/recovery_worker.py" --steps "$STEPS" --out "$T/out"
  else
    echo "$TESTS/rendezvous/workers/elastic_trainer.py" "$T/snapshot" "$STEPS"
  fi
}

# finish PODS WORLD: every pod's ddprun ends 0 and every rank reached step STEPS at WORLD.
finish() {
  local pods=$1 world=$2
  for ((n = 0; n < pods; n++)); do
    wait_exit "${pids[n]}" 150 || { cat "$T/pods.txt"; fail "pod $n: ddprun exited with $?"; }
  done
  if [[ -d "$T/out" ]]; then
    for ((r = 0; r < world; r++)); do
      grep -q "\"world_size\": $world, \"step\": $STEPS" "$T/out/rank$r.json" 2>/dev/null ||
        fail "rank $r: $(cat "$T/out/rank$r.json" 2>/dev/null || echo 'no report')"
    done
    [[ $(md5sum "$T"/out/rank*.params | awk '{print $1}' | sort -u | wc -l) -eq 1 ]] ||
      fail "the ranks' parameters differ"
  else
    cat "$T"/pod*.log >"$T/all.txt"
    for ((r = 0; r < world; r++)); do
      expect_in "$T/all.txt" "done RANK=$r WORLD_SIZE=$world step=$STEPS"
    done
  fi
  echo "PASS: $SCENARIO: $pods pods formed a world of $world ranks and trained $STEPS steps"
}

declare -a pids
case "$SCENARIO" in
pytorchjob)
  read_manifest "$DEPLOY/pytorchjob.yaml"
  setup_nodes 3
  names=(mnist-master-0 mnist-worker-0 mnist-worker-1)
  map_hosts "${names[@]}"
  for node in 0 1 2; do
    # setPodEnv: master first (RANK 0), workers index + 1; WORLD_SIZE = pods x nprocPerNode.
    POD_ENV=(PYTHONUNBUFFERED=1 MASTER_PORT=23456 MASTER_ADDR=mnist-master-0 WORLD_SIZE=3
      RANK=$node PET_NODE_RANK=$node PET_NPROC_PER_NODE=1 PET_NNODES=3)
    start_pod "$node" "${names[node]}" $(trainer)
  done
  finish 3 3
  ;;

pytorchjob-elastic)
  read_manifest "$DEPLOY/pytorchjob-elastic.yaml"
  setup_nodes 2
  names=(elastic-worker-0 elastic-worker-1)
  map_hosts "${names[@]}"
  for node in 0 1; do
    # No master replica: no MASTER_ADDR or RANK; the elastic policy's PET_ variables.
    POD_ENV=(PYTHONUNBUFFERED=1 PET_NPROC_PER_NODE=1 PET_RDZV_ENDPOINT=elastic-worker-0:23456
      PET_RDZV_BACKEND=c10d PET_NNODES=1:3 PET_MAX_RESTARTS=3
      PET_RDZV_CONF=join_timeout=300,last_call_timeout=5)
    start_pod "$node" "${names[node]}" $(trainer)
  done
  finish 2 2
  ;;

trainjob)
  read_manifest "$DEPLOY/trainjob.yaml"
  setup_nodes 2
  names=(mnist-trainer-node-0-0.mnist mnist-trainer-node-0-1.mnist)
  map_hosts "${names[@]}"
  for node in 0 1; do
    # The Torch plugin; PET_NODE_RANK is the pod's job completion index (also JOB_COMPLETION_
    # INDEX, which Kubernetes sets in every pod of an indexed Job).
    POD_ENV=(PET_NNODES=2 PET_NPROC_PER_NODE=1 PET_NODE_RANK=$node JOB_COMPLETION_INDEX=$node
      PET_MASTER_ADDR=mnist-trainer-node-0-0.mnist PET_MASTER_PORT=29500)
    start_pod "$node" "${names[node]%%.*}" $(trainer)
  done
  finish 2 2
  ;;

jobset)
  read_manifest "$DEPLOY/jobset.yaml"
  # The manifest's own env: its name/value pairs; PET_NODE_RANK (a fieldRef) is the index.
  mapfile -t MANIFEST_ENV < <("$PY" - "$DEPLOY/jobset.yaml" <<'PY'
import re, sys
name = None
for line in open(sys.argv[1]):
    m = re.match(r'\s*- name: (PET_\w+)\s*$', line)
    if m:
        name = m.group(1)
        continue
    m = re.match(r'\s*value: "?([^"\s]*)"?\s*$', line)
    if m and name:
        print(f"{name}={m.group(1)}")
    name = None
PY
  )
  setup_nodes 2
  names=(mnist-workers-0-0.mnist mnist-workers-0-1.mnist)
  map_hosts "${names[@]}"
  for node in 0 1; do
    POD_ENV=("${MANIFEST_ENV[@]}" PET_NODE_RANK=$node JOB_COMPLETION_INDEX=$node)
    start_pod "$node" "${names[node]%%.*}" $(trainer)
  done
  finish 2 2
  ;;

volcano)
  read_manifest "$DEPLOY/volcano-job.yaml"
  setup_nodes 2
  names=(mnist-master-0.mnist mnist-worker-0.mnist)
  map_hosts "${names[@]}"
  for node in 0 1; do
    POD_ENV=(MASTER_ADDR=mnist-master-0.mnist MASTER_PORT=23456 WORLD_SIZE=2 RANK=$node)
    start_pod "$node" "${names[node]%%.*}" $(trainer)
  done
  finish 2 2
  grep -q "using Kubernetes: 2 nodes, this is node 1, master mnist-master-0.mnist:23456" \
    "$T/pod1.log" || fail "pod 1 did not say what it detected"
  ;;

*)
  echo "unknown scenario $SCENARIO" >&2
  exit 2
  ;;
esac
