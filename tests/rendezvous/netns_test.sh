#!/usr/bin/env bash
# Multi-node ddprun runs on one machine: every node is its own network namespace with a veth
# to a bridge (in a hub namespace of its own, so the host's firewall never sees the traffic),
# addresses 10.78.0.<i+1>/24. No packet leaves loopback and these namespaces.
#
# Usage: netns_test.sh SCENARIO DDPRUN WORKERS_DIR [PYTHON]   (PYTHON: an interpreter with torch)
#   train    3 nodes (2+1+2 workers, c10d) train a PyTorch gloo job to the end
#   elastic  --nnodes 2:3: SIGKILL one agent, the others go on with 4 workers; a node arriving
#            later is admitted and the job finishes with 6 (membership changes do not use
#            --max-restarts 0)
#   diagnose --nnodes 3: one node's link is down, one uses another --rdzv-id; the agents name
#            both in their diagnosis within join_timeout, the cut-off node fails at once
#   static   --rdzv-backend static with --node-rank and a token file; a node with the wrong
#            token is refused
#   stacks   2 nodes x 2 sleeping workers, a token, a runtime folder per node: `ddprun stacks`
#            on node 0 folds all 4 ranks' stacks, node 1's through the job's store; then a
#            worker of node 1 is killed and node 1's failure report shows the 3 others' stacks
#   store_host_lost  --nnodes 2:3, 2 workers per node: node 0, which serves the c10d store
#            (the endpoint is its address), dies (every process in its namespace killed while
#            the job trains); the two others move to the round's standby store, resume from
#            the snapshot with WORLD_SIZE=4 and finish (exit 0)
#   store_host_lost_torchrun  the same job under torchrun (PYTHON -m torch.distributed.run),
#            for the record (docs/rendezvous.md): prints what the survivors did, asserts nothing
#   recovery_step  2 nodes x 2 recovery_worker ranks (RECOVERY_WORKER is the 4th argument),
#            --recovery step: a worker killed on each node is restarted alone by its agent; the
#            job ends 0 with every rank at 20 steps and bitwise equal parameters
#   recovery_lost_node  2 nodes x 2 recovery_worker ranks (4th argument), --nnodes 1:2,
#            --recovery step: node 1's link is taken down after its rank 2 committed step 8;
#            node 0's agent takes ranks 2-3 out of the job and its two workers finish at world
#            size 2 (exit 0, each step committed once, bitwise equal parameters)
#   recovery_lost_store_host  3 nodes x 2 recovery_worker ranks (4th argument), --nnodes 2:3,
#            c10d, --recovery step with the default standby stores: node 0, which serves the
#            rendezvous store and the step store, has its link taken down after its rank 0
#            committed step 8 (no RST: calls to its stores hang); nodes 1 and 2 promote the
#            standbys and their 4 workers finish in the same round (exit 0, each step committed
#            once, generation 1, bitwise equal parameters); prints the cut-to-recovery time
#   recovery_replaced_node  as recovery_lost_node, then a third node (its own namespace) takes
#            node 1's place while the job runs, and node 1's link comes back up (a split that
#            heals): ranks 2-3 return in node 2's workers, node 1's old workers find no place;
#            nodes 0 and 2 end 0 with all 4 ranks at generation 2, bitwise equal parameters
#   hang     2 nodes x 2 hang_worker ranks (gloo, 3 s group timeout; HANG_WORKER is the 4th
#            argument), rank 3 on node 1 stops after collective #12: each node's hang report
#            names rank 3 from the records both agents shared through the rendezvous store
# Exit 77 (ctest: skipped) with the reason when not root or without iproute2. Always removes
# its namespaces and temp dir; every wait is bounded.
set -uo pipefail
# A pipe ends in `grep PATTERN >/dev/null`, never `grep -q`: grep -q exits at its first match,
# and a writer still writing then dies of SIGPIPE, which pipefail makes the pipe's failure.

SCENARIO="${1:?usage: netns_test.sh SCENARIO DDPRUN WORKERS_DIR [PYTHON]}"
DDPRUN="${2:?}"
WORKERS="${3:?}"
PY="${4:-python3}"  # the build's interpreter with torch (DDP_PYTHON): the trainer imports it

# shellcheck source=netns_lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/netns_lib.sh"

C10D=(--rdzv-backend c10d --rdzv-endpoint 10.78.0.1:29400)
TRAINER="$WORKERS/elastic_trainer.py"

case "$SCENARIO" in
train)
  setup_nodes 3
  conf="join_timeout=90,last_call_timeout=1,heartbeat=1"
  for node in 0 1 2; do
    nproc=$((node == 1 ? 1 : 2))
    start_agent "$node" "node$node" --nnodes 3 --nproc-per-node "$nproc" "${C10D[@]}" \
      --rdzv-id "train$TAG" --rdzv-conf "$conf" "$PY" "$TRAINER" "$T/snapshot" 20 --step-s 0.02
    pids[node]=$LAST_PID
  done
  for node in 0 1 2; do
    wait_exit "${pids[node]}" 150 || fail "node $node: ddprun exited with $?"
  done
  cat "$T"/node*.log >"$T/all.txt"
  [[ $(grep -c '^done RANK=' "$T/all.txt") -eq 5 ]] || fail "expected 5 workers to finish"
  for r in 0 1 2 3 4; do expect_in "$T/all.txt" "done RANK=$r WORLD_SIZE=5 step=20"; done
  for g in 0 1 2; do expect_in "$T/all.txt" "GROUP_RANK=$g "; done
  # Node 1 has one worker; the nodes with two hold two consecutive ranks each.
  [[ $(grep -c '^worker RANK=' "$T/node1.log") -eq 1 ]] || fail "node 1 should run 1 worker"
  echo "PASS: 3 nodes (2+1+2 workers) trained to the end with WORLD_SIZE=5"
  ;;

elastic)
  setup_nodes 3
  conf="join_timeout=90,last_call_timeout=2,heartbeat=1"
  args=(--nnodes 2:3 --nproc-per-node 2 --max-restarts 0 "${C10D[@]}" --rdzv-id "elastic$TAG"
    --rdzv-conf "$conf" "$PY" "$TRAINER" "$T/snapshot" 20 --step-s 0.1 --until-world 6
    --until-file "$T/late-started")
  for node in 0 1 2; do
    start_agent "$node" "node$node" "${args[@]}"
    pids[node]=$LAST_PID
  done
  wait_grep 120 "WORLD_SIZE=6 " "$T/node0.log" "$T/node1.log" "$T/node2.log"
  wait_grep 60 '"step"' "$T/snapshot"
  kill -9 "${pids[2]}"
  wait "${pids[2]}" 2>/dev/null
  echo "killed node 2's agent (SIGKILL)"
  wait_grep 120 "WORLD_SIZE=4 " "$T/node0.log" "$T/node1.log"
  echo "the survivors run with WORLD_SIZE=4; starting a node late"
  start_agent 2 node2late "${args[@]}"
  late=$LAST_PID
  touch "$T/late-started"
  for p in "${pids[0]}" "${pids[1]}" "$late"; do
    wait_exit "$p" 150 || fail "an agent exited with $?"
  done
  cat "$T/node0.log" "$T/node1.log" "$T/node2late.log" >"$T/all.txt"
  [[ $(grep -c '^done RANK=[0-5] WORLD_SIZE=6 ' "$T/all.txt") -eq 6 ]] ||
    fail "expected 6 workers to finish with WORLD_SIZE=6"
  # Whichever survivor saw a worker fail first re-joined and was not charged a restart
  # (--max-restarts 0 would have ended the job); the other was stopped by the membership change.
  # Under load both can be stopped by the change (the lost node's heartbeats, 3 s, run out
  # before a worker's gloo error ends it): then neither needs the uncharged restart. The killed
  # agent's node rank is the round's, given in the order the agents joined: any of 0-2 (a CI run
  # once failed here when it was 1).
  cat "$T/node0.log" "$T/node1.log" >"$T/survivors.txt"
  grep -qF "a node was lost, so this restart does not count against --max-restarts" \
    "$T/survivors.txt" || grep -q "membership changed (node rank [0-2] .* missed [0-9]* heartbeats" \
    "$T/survivors.txt" || fail "survivors.txt shows neither an uncharged restart nor the lost node"
  expect_in "$T/survivors.txt" "1 node is waiting to join (round 1 has 2 of at most 3 nodes)"
  # TORCHELASTIC_RESTART_COUNT counts this agent's restarts after a failure (torchrun), not the
  # rendezvous round: the late node's first workers see 0, though they join round 2 or later.
  grep -q "RESTART=0 " "$T/node2late.log" || fail "the late node's first workers did not see TORCHELASTIC_RESTART_COUNT=0"
  grep -q "RESTART=[1-9] " "$T/node2late.log" && fail "the late node's workers saw a restart count above 0"
  # Workers resumed from the snapshot instead of step 0 after the shrink.
  grep "WORLD_SIZE=4 " "$T/node0.log" | grep -v "start_step=0$" >/dev/null ||
    fail "the shrunken round did not resume from the snapshot"
  echo "PASS: survived a SIGKILLed agent with WORLD_SIZE=4, admitted a late node, finished with 6"
  ;;

diagnose)
  setup_nodes 4
  conf="join_timeout=6,connect_timeout=2,heartbeat=1"
  ip -n "$(ns_of 2)" link set rdzv0 down  # node 2 is cut off
  start_agent 0 node0 --nnodes 3 "${C10D[@]}" --rdzv-id "diag$TAG" --rdzv-conf "$conf" \
    --no-python /bin/true
  p0=$LAST_PID
  wait_grep 10 "" "$T/node0.log"
  start_agent 1 node1 --nnodes 3 "${C10D[@]}" --rdzv-id "diag$TAG" --rdzv-conf "$conf" \
    --no-python /bin/true
  p1=$LAST_PID
  start_agent 2 node2 --nnodes 3 "${C10D[@]}" --rdzv-id "diag$TAG" --rdzv-conf "$conf" \
    --no-python /bin/true
  p2=$LAST_PID
  start_agent 3 node3 --nnodes 3 "${C10D[@]}" --rdzv-id "other$TAG" --rdzv-conf "$conf" \
    --no-python /bin/true
  p3=$LAST_PID
  wait_exit "$p2" 30 && fail "the cut-off node succeeded"
  expect_in "$T/node2.log" "cannot reach the rendezvous endpoint 10.78.0.1:29400"
  grep -Eq "unreachable|No route" "$T/node2.log" || fail "node 2 does not say why"
  expect_in "$T/node2.log" "Retried for 2.0 s (connect_timeout)"
  for p in "$p0" "$p1" "$p3"; do wait_exit "$p" 60 && fail "an agent succeeded"; done
  for n in 0 1; do
    f="$T/node$n.log"
    expect_in "$f" "rendezvous timed out waiting for nodes to join: 2 of 3 nodes joined run 'diag$TAG' at endpoint 10.78.0.1:29400"
    expect_in "$f" "(join_timeout 6.0 s)"
    expect_in "$f" "  missing: node rank 2 (c10d assigns node ranks in join order)"
    expect_in "$f" "agents at this endpoint used --rdzv-id other$TAG (from"
    expect_in "$f" "1. a node was started with a different --rdzv-id (other$TAG instead of diag$TAG)"
    expect_in "$f" "(10.78.0.1, 1 worker)"
    expect_in "$f" "(10.78.0.2, 1 worker)"
  done
  expect_in "$T/node3.log" "1 of 3 nodes joined run 'other$TAG'"
  expect_in "$T/node3.log" "agents at this endpoint used --rdzv-id diag$TAG"
  echo "PASS: the diagnosis names the missing node rank, the other run id and the cut-off node"
  ;;

static)
  setup_nodes 3
  echo "s3cret-$TAG" >"$T/token"
  echo "wrong-$TAG" >"$T/badtoken"
  chmod 600 "$T/token" "$T/badtoken"
  worker=(--no-python /bin/sh -c 'echo "env RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE GROUP_RANK=$GROUP_RANK MASTER=$MASTER_ADDR:$MASTER_PORT"')
  common=(--rdzv-backend static --nnodes 2 --master-addr 10.78.0.1 --master-port 29500
    --rdzv-id "static$TAG")
  start_agent 0 node0 "${common[@]}" --node-rank 0 --nproc-per-node 2 \
    --rdzv-conf "join_timeout=60,token_file=$T/token" "${worker[@]}"
  p0=$LAST_PID
  # A stranger with the wrong token is refused at once and cannot take node rank 1.
  start_agent 2 stranger "${common[@]}" --node-rank 1 \
    --rdzv-conf "join_timeout=60,connect_timeout=5,token_file=$T/badtoken" "${worker[@]}"
  wait_exit "$LAST_PID" 30 && fail "the stranger was let in"
  expect_in "$T/stranger.log" "refused this node"
  expect_in "$T/stranger.log" "same token"
  start_agent 1 node1 "${common[@]}" --node-rank 1 --nproc-per-node 1 \
    --rdzv-conf "join_timeout=60,token_file=$T/token" "${worker[@]}"
  p1=$LAST_PID
  wait_exit "$p0" 60 || fail "node 0 exited with $?"
  wait_exit "$p1" 60 || fail "node 1 exited with $?"
  expect_in "$T/node0.log" "env RANK=0 LOCAL_RANK=0 WORLD_SIZE=3 GROUP_RANK=0 MASTER=10.78.0.1:29500"
  expect_in "$T/node0.log" "env RANK=1 LOCAL_RANK=1 WORLD_SIZE=3 GROUP_RANK=0 MASTER=10.78.0.1:29500"
  expect_in "$T/node1.log" "env RANK=2 LOCAL_RANK=0 WORLD_SIZE=3 GROUP_RANK=1 MASTER=10.78.0.1:29500"
  echo "PASS: static backend with node ranks and a token; the stranger was refused"
  ;;

store_host_lost | store_host_lost_torchrun)
  setup_nodes 3
  conf="join_timeout=90,last_call_timeout=2,heartbeat=1"
  launch=(--nnodes 2:3 --nproc-per-node 2 --max-restarts 0 "${C10D[@]}" --rdzv-id "lost$TAG")
  trainer=("$TRAINER" "$T/snapshot" 100 --step-s 0.1)
  for node in 0 1 2; do
    if [[ $SCENARIO == store_host_lost ]]; then
      start_agent "$node" "node$node" "${launch[@]}" --rdzv-conf "$conf" "$PY" "${trainer[@]}"
    else
      # torchrun knows a node by the machine's host name, which does not resolve to the
      # namespace's address: each node is given its address (--local-addr) and node 0 is told
      # that it serves the store (torchrun's is_host key).
      node_conf=$conf
      ((node == 0)) && node_conf+=",is_host=1"
      start_torchrun "$node" "node$node" "${launch[@]}" --rdzv-conf "$node_conf" \
        --local-addr "10.78.0.$((node + 1))" "${trainer[@]}"
    fi
    pids[node]=$LAST_PID
    # Node 0 serves the store (the endpoint is its address): it starts first.
    ((node == 0)) && sleep 2
  done
  wait_grep 120 "WORLD_SIZE=6 " "$T/node0.log" "$T/node1.log" "$T/node2.log"
  wait_grep 60 '"step"' "$T/snapshot"
  kill_node 0
  wait "${pids[0]}" 2>/dev/null
  echo "node 0 died (every process in its namespace SIGKILLed) at $(cat "$T/snapshot")"
  died=$SECONDS
  if [[ $SCENARIO == store_host_lost_torchrun ]]; then
    for node in 1 2; do
      code=0
      wait_exit "${pids[node]}" 200 || code=$?
      echo "RECORD: torchrun on node $node exited with $code, $((SECONDS - died)) s after node 0 died; its last lines:"
      grep -v '^\s*$' "$T/node$node.log" | tail -n 12 | sed 's/^/    /'
    done
    exit 0
  fi
  for node in 1 2; do
    wait_exit "${pids[node]}" 150 || fail "node $node: ddprun exited with $?"
  done
  echo "both survivors ended 0, $((SECONDS - died)) s after node 0 died"
  grep -h "^done RANK=" "$T/node1.log" "$T/node2.log"
  cat "$T/node1.log" "$T/node2.log" >"$T/survivors.txt"
  [[ $(grep -c '^done RANK=[0-3] WORLD_SIZE=4 step=100' "$T/survivors.txt") -eq 4 ]] ||
    fail "expected 4 workers to finish with WORLD_SIZE=4"
  for node in 1 2; do
    expect_in "$T/node$node.log" "lost the rendezvous store at 10.78.0.1:29400"
    expect_in "$T/node$node.log" "moving to the job's standby store (in order: 10.78.0."
  done
  [[ $(grep -c "this node serves the rendezvous store now" "$T/survivors.txt") -eq 1 ]] ||
    fail "not exactly one survivor serves the store"
  expect_in "$T/survivors.txt" "moved to the rendezvous store at 10.78.0."
  # The round moved with the store: the waiting line names the standby, not the lost endpoint.
  for node in 1 2; do
    expect_in "$T/node$node.log" "waiting for the other nodes of c10d run 'lost$TAG' (2 to 3 nodes): the rendezvous store is 10.78.0."
    grep "waiting for the other nodes" "$T/node$node.log" | grep "store is 10.78.0.[23]:" >/dev/null ||
      fail "node $node's waiting line after the move does not name the standby store"
  done
  # The survivors were stopped by the membership change (or their workers failed with the
  # lost peers: then the smaller round does not count against --max-restarts 0).
  grep "WORLD_SIZE=4 " "$T/survivors.txt" | grep "^worker" >/dev/null || fail "no worker restarted"
  grep "^worker .*WORLD_SIZE=4 " "$T/survivors.txt" | grep -v "start_step=0$" >/dev/null ||
    fail "the round of 2 nodes did not resume from the snapshot"
  echo "PASS: node 0, which served the store, died; the two others moved to a standby store and finished from the snapshot"
  ;;

hang)
  HANG_WORKER="${4:?the hang scenario needs the hang_worker binary}"
  setup_nodes 2
  for node in 0 1; do
    start_agent "$node" "node$node" --nnodes 2 --nproc-per-node 2 "${C10D[@]}" \
      --rdzv-id "hang$TAG" --rdzv-conf "join_timeout=60" --log-dir "$T/logs$node" \
      --no-python env HANG_WORKER_TIMEOUT_MS=3000 "$HANG_WORKER" gloo stall 3 12
    pids[node]=$LAST_PID
  done
  # Group timeout 3 s + 15 s, after the rendezvous.
  for node in 0 1; do
    wait_exit "${pids[node]}" 40 && fail "node $node: ddprun succeeded despite the hang"
  done
  for node in 0 1; do
    f="$T/node$node.log"
    expect_in "$f" "ddprun: hang report: rank 3 is behind: its last collective was all_reduce #12 (float32 x 256, sum, completed; iter=12); ranks 0,1,2 wait in all_reduce #13 (iter=13) since"
    expect_in "$f" "ddprun: hang report from 2 of 2 nodes"
  done
  # Rank 3's dump is in one node's log dir only (c10d gives node ranks in join order): the
  # other node's report came through the store.
  holders=$(ls "$T"/logs0/*/attempt_0/flight_recorder.*.rank3.json \
    "$T"/logs1/*/attempt_0/flight_recorder.*.rank3.json 2>/dev/null | wc -l)
  [[ $holders -eq 1 ]] || fail "rank 3's dump is in $holders log dirs, expected 1"
  echo "PASS: both nodes' hang reports name rank 3 from the records shared through the store"
  ;;

recovery_step)
  # ddprun --recovery step on 2 nodes x 2 ranks of recovery_worker (the 4th argument; cpu
  # backend: shared memory within a node, the leaders' TCP ring between the namespaces): rank 1
  # (one node) is killed at step 4 and rank 2 (the other) at step 10; each node's agent restarts
  # its own worker alone and records the loss in the store the agent of rank 0's node hosts.
  RECOVERY_WORKER="${4:?the recovery_step scenario needs the recovery_worker binary}"
  setup_nodes 2
  mkdir -p "$T/out"
  for node in 0 1; do
    DDP_HOST_ID="netns$node" DDP_TEST_KILL_AT_STEP=4,10 DDP_TEST_KILL_RANK=1,2 \
      DDP_TEST_KILL_PHASE=backward start_agent "$node" "node$node" --nnodes 2 \
      --nproc-per-node 2 "${C10D[@]}" --rdzv-id "recovery$TAG" --rdzv-conf "join_timeout=60" \
      --recovery step --max-restarts 1 --no-python "$RECOVERY_WORKER" --steps 20 --out "$T/out"
    pids[node]=$LAST_PID
  done
  for node in 0 1; do
    wait_exit "${pids[node]}" 120 || fail "node $node: ddprun exited $?"
  done
  for rank in 1 2; do
    grep -q "restarting only rank $rank (--recovery step, restart 1 of 1" "$T"/node*.log ||
      fail "rank $rank was not restarted alone"
  done
  grep -q "timed out\|restarting the worker group" "$T"/node*.log &&
    fail "a collective timed out or a group restarted"
  for rank in 0 1 2 3; do
    grep -q '"step":20,.*"generation":2' "$T/out/rank$rank.json" ||
      fail "rank $rank: $(cat "$T/out/rank$rank.json" 2>/dev/null || echo 'no report')"
  done
  [[ $(md5sum "$T"/out/rank*.params | awk '{print $1}' | sort -u | wc -l) -eq 1 ]] ||
    fail "the ranks' parameters differ"
  cat "$T"/node*.log
  echo "PASS: two nodes, one worker killed on each; each agent restarted its own, every rank committed 20 steps at generation 2 with bitwise equal parameters"
  ;;

recovery_lost_node)
  # A node lost to the network (not a crash): its sockets stay open, so the survivors' leaders'
  # TCP ring ends on ddprun's notice, after node 1 missed 3 heartbeats (heartbeat 1 s). No
  # standby stores: the cut-off node must not form a job of its own on one (a split, see
  # docs/rendezvous.md), it fails once it has lost the store.
  RECOVERY_WORKER="${4:?the recovery_lost_node scenario needs the recovery_worker binary}"
  STEPS=400  # many short steps: the link goes down while they run, whatever the machine's speed
  setup_nodes 2
  mkdir -p "$T/out"
  for node in 0 1; do
    DDP_HOST_ID="netns$node" start_agent "$node" "node$node" --nnodes 1:2 --nproc-per-node 2 \
      "${C10D[@]}" --rdzv-id "lost$TAG" \
      --rdzv-conf "join_timeout=60,heartbeat=1,last_call_timeout=10,standby_stores=0" \
      --recovery step --max-restarts 1 --no-python "$RECOVERY_WORKER" --steps "$STEPS" --out "$T/out"
    pids[node]=$LAST_PID
    ((node == 0)) && sleep 1  # node 0 joins first: the round's node 0 hosts the step store
  done
  wait_for_commit "$T/out/rank2.commits" 8 120 || fail "rank 2 (node 1) never committed step 8"
  ip -n "$(ns_of 1)" link set rdzv0 down
  wait_exit "${pids[0]}" 120 || fail "node 0: ddprun exited $?"
  kill_node 1
  expect_in "$T/node0.log" "its ranks 2-3 leave the job and the other 2 workers go on"
  # (The flight recorder's wait for the lost ranks' records times out, by design.)
  grep "timed out\|restarting the worker group" "$T/node0.log" | grep -v "flight recorder" >/dev/null &&
    fail "node 0: a collective timed out or the group restarted"
  for rank in 0 1; do
    grep -q '"world_size":2,"step":'"$STEPS"',.*"generation":1' "$T/out/rank$rank.json" ||
      fail "rank $rank: $(cat "$T/out/rank$rank.json" 2>/dev/null || echo 'no report')"
    [[ $(awk '{print $2}' "$T/out/rank$rank.commits" | tr '\n' ' ') == "$(seq -s ' ' 1 "$STEPS") " ]] ||
      fail "rank $rank committed: $(awk '{print $2}' "$T/out/rank$rank.commits" | tr '\n' ' ')"
  done
  awk '$3 == 2 {n++} END {exit !(n > 0)}' "$T/out/rank0.commits" ||
    fail "rank 0 committed no step at world size 2"
  cmp -s "$T/out/rank0.params" "$T/out/rank1.params" || fail "the survivors' parameters differ"
  cat "$T/node0.log"
  echo "PASS: node 1 cut off after step 8; node 0's two workers went on at world size 2 to step $STEPS (exit 0, generation 1, bitwise equal parameters)"
  ;;

recovery_lost_store_host)
  # The round's node 0 lost to the network (not a crash) while its agent serves both the c10d
  # rendezvous store and the workers' step store: no RST, so the survivors' calls to both stores
  # hang until they time out; they then promote the standbys (nodes 1..2, default
  # standby_stores) and go on in the same round with 4 ranks (docs/recovery.md, "When node 0 is
  # lost"; docs/rendezvous.md, "When the store's host is lost (c10d)").
  RECOVERY_WORKER="${4:?the recovery_lost_store_host scenario needs the recovery_worker binary}"
  STEPS=400  # many short steps: the link goes down while they run, whatever the machine's speed
  setup_nodes 3
  mkdir -p "$T/out"
  for node in 0 1 2; do
    # 20 ms after each step: the cut lands a few steps after step 8 (the test polls at 0.1 s).
    DDP_HOST_ID="netns$node" DDP_TEST_STEP_SLEEP_MS=20 start_agent "$node" "node$node" \
      --nnodes 2:3 --nproc-per-node 2 \
      "${C10D[@]}" --rdzv-id "storehost$TAG" \
      --rdzv-conf "join_timeout=60,heartbeat=1,last_call_timeout=10" \
      --recovery step --max-restarts 1 --no-python "$RECOVERY_WORKER" --steps "$STEPS" --out "$T/out"
    pids[node]=$LAST_PID
    ((node == 0)) && sleep 1  # node 0 joins first: it serves both stores as the round's node 0
  done
  wait_for_commit "$T/out/rank0.commits" 8 120 || fail "rank 0 (node 0) never committed step 8"
  ip -n "$(ns_of 0)" link set rdzv0 down
  cut=$(date +%s.%N)
  cut_s=$SECONDS
  cut_step=$(awk 'END {print $2}' "$T/out/rank0.commits")
  # Ranks 0-1 must be node 0's (the round's node 0), not another's.
  grep -q "this is node 0 (ranks 0-1)" "$T/node0.log" ||
    fail "node 0's agent was not the round's node 0: $(grep 'rendezvous round' "$T/node0.log")"
  echo "node 0's link is down (rank 0 had committed step $cut_step)"
  # The first commit at world size 4 (the commit logs hold no time: polled every 0.1 s).
  recovered=""
  for ((k = 0; k < 1800; k++)); do
    if awk '$3 == 4 {found = 1} END {exit !found}' "$T/out/rank2.commits" 2>/dev/null; then
      recovered=$(date +%s.%N)
      break
    fi
    kill -0 "${pids[1]}" 2>/dev/null || kill -0 "${pids[2]}" 2>/dev/null || break
    sleep 0.1
  done
  [[ -n "$recovered" ]] ||
    fail "rank 2 committed no step at world size 4 within $((SECONDS - cut_s)) s of the cut"
  for node in 1 2; do
    wait_exit "${pids[node]}" $((180 - (SECONDS - cut_s))) || fail "node $node: ddprun exited $?"
  done
  finished_s=$((SECONDS - cut_s))
  kill_node 0  # cut off, it cannot end by itself (MIN 2): only that it is stopped is checked
  for ((k = 0; k < 100; k++)); do kill -0 "${pids[0]}" 2>/dev/null || break; sleep 0.1; done
  kill -0 "${pids[0]}" 2>/dev/null && fail "node 0's agent survived kill_node"
  wait "${pids[0]}" 2>/dev/null
  cat "$T/node1.log" "$T/node2.log" >"$T/survivors.txt"
  [[ $(grep -c "this node serves the rendezvous store now" "$T/survivors.txt") -eq 1 ]] ||
    fail "not exactly one survivor serves the rendezvous store"
  expect_in "$T/survivors.txt" "moved to the rendezvous store at 10.78.0."
  expect_in "$T/survivors.txt" "node 0 served the job's --recovery step store: its standby at"
  expect_in "$T/survivors.txt" "its ranks 0-1 leave the job and the other 4 workers go on"
  grep "restarting the worker group\|joining the next round" "$T/survivors.txt" &&
    fail "a survivor restarted its worker group or joined a new round"
  # Every survivor commits each step once, in order, up to STEPS. The cut can land inside a
  # step's all-reduce between hosts, which then completes on one survivor's node and not on
  # another's: that rank drops the step and heals it in from the peer that committed it (a CI
  # run: rank 2 missed step 54, which node 2's ranks had committed). So a step a rank lacks must
  # be one another survivor committed.
  cat "$T"/out/rank{2,3,4,5}.commits | awk '{print $2}' | sort -un >"$T/committed_by_any"
  for rank in 2 3 4 5; do
    grep -q '"world_size":4,"step":'"$STEPS"',.*"generation":1' "$T/out/rank$rank.json" ||
      fail "rank $rank: $(cat "$T/out/rank$rank.json" 2>/dev/null || echo 'no report')"
    awk -v steps="$STEPS" '$2 <= last {bad = 1} {last = $2} END {exit bad || last != steps}' \
      "$T/out/rank$rank.commits" ||
      fail "rank $rank committed: $(awk '{print $2}' "$T/out/rank$rank.commits" | tr '\n' ' ')"
    missing=$(comm -23 <(seq 1 "$STEPS" | sort) <(awk '{print $2}' "$T/out/rank$rank.commits" | sort))
    for step in $missing; do
      grep -qx "$step" "$T/committed_by_any" ||
        fail "rank $rank lacks step $step, which no survivor committed (a step lost)"
      echo "rank $rank healed step $step in from a survivor that committed it"
    done
    [[ $(awk '{print $1}' "$T/out/rank$rank.commits" | sort -u | wc -l) -eq 1 ]] ||
      fail "rank $rank's steps were committed by more than one process"
    # World size 6 up to the cut, 4 from then on.
    awk '$3 != 6 && $3 != 4 {bad = 1} $3 == 6 && seen4 {bad = 1} $3 == 4 {seen4 = 1}
      END {exit bad || !seen4}' "$T/out/rank$rank.commits" ||
      fail "rank $rank's world sizes: $(awk '{print $3}' "$T/out/rank$rank.commits" | uniq -c | tr '\n' ' ')"
  done
  for rank in 3 4 5; do
    cmp -s "$T/out/rank2.params" "$T/out/rank$rank.params" || fail "rank $rank's parameters differ"
  done
  for node in 1 2; do
    echo "---- node $node"
    grep -E "^ddprun" "$T/node$node.log" | cut -c1-400
  done
  last6=$(awk '$3 == 6 {s = $2} END {print s}' "$T/out/rank2.commits")
  echo "RECORD: node 0 cut off after its step $cut_step; the survivors' last step at world size 6: $last6; their first commit at world size 4 came $(awk -v a="$recovered" -v b="$cut" 'BEGIN {printf "%.1f", a - b}') s after the cut; both survivors ended $finished_s s after it"
  echo "PASS: node 0 (both stores' host) cut off once its rank 0 had committed step 8 (RECORD: the exact step); nodes 1 and 2 promoted the standbys and their 4 workers went on at world size 4 to step $STEPS (exit 0, generation 1, each step committed once, bitwise equal parameters)"
  ;;

recovery_replaced_node)
  # A lost node replaced while the job runs, over real network stacks, and the lost node coming
  # back after its place was taken: its processes must not take the ranks back.
  RECOVERY_WORKER="${4:?the recovery_replaced_node scenario needs the recovery_worker binary}"
  STEPS=300
  setup_nodes 3
  mkdir -p "$T/out"
  start_node() {  # start_node NODE
    DDP_HOST_ID="netns$1" DDP_TEST_STEP_SLEEP_MS=40 DDP_TEST_OPTIMIZER=sgd start_agent "$1" \
      "node$1" --nnodes 1:2 --nproc-per-node 2 "${C10D[@]}" --rdzv-id "replaced$TAG" \
      --rdzv-conf "join_timeout=60,heartbeat=1,last_call_timeout=10,standby_stores=0" \
      --recovery step --max-restarts 1 --no-python "$RECOVERY_WORKER" --steps "$STEPS" \
      --out "$T/out"
    pids[$1]=$LAST_PID
  }
  start_node 0
  sleep 1  # node 0 joins first: the round's node 0 hosts the step store
  start_node 1
  wait_for_commit "$T/out/rank2.commits" 8 120 || fail "rank 2 (node 1) never committed step 8"
  ip -n "$(ns_of 1)" link set rdzv0 down
  wait_for_text "$T/node0.log" "its ranks 2-3 leave the job" 60 ||
    fail "node 0 did not take node 1's loss in place"
  start_node 2
  wait_for_text "$T/node2.log" "this node takes the place of node 1" 60 ||
    fail "node 2 did not take node 1's place"
  sleep 2
  ip -n "$(ns_of 1)" link set rdzv0 up  # the split heals: node 1's processes are still there
  wait_exit "${pids[0]}" 180 || fail "node 0: ddprun exited $?"
  wait_exit "${pids[2]}" 60 || fail "node 2: ddprun exited $?"
  node1_code=0
  wait_exit "${pids[1]}" 30 || node1_code=$?
  kill_node 1
  grep "restarting the worker group" "$T/node0.log" "$T/node2.log" &&
    fail "a worker group restarted"
  for rank in 0 1 2 3; do
    grep -q '"world_size":4,"step":'"$STEPS"',.*"generation":2' "$T/out/rank$rank.json" ||
      fail "rank $rank: $(cat "$T/out/rank$rank.json" 2>/dev/null || echo 'no report')"
  done
  for rank in 0 1; do
    [[ $(awk '{print $2}' "$T/out/rank$rank.commits" | tr '\n' ' ') == "$(seq -s ' ' 1 "$STEPS") " ]] ||
      fail "rank $rank committed: $(awk '{print $2}' "$T/out/rank$rank.commits" | tr '\n' ' ')"
  done
  # Ranks 2-3: the old processes' steps, then the new ones' from their return to the end, each
  # once: the old processes committed nothing after the split healed.
  for rank in 2 3; do
    awk -v steps="$STEPS" '
      { if ($1 != pid) { lives++; pid = $1; if (lives == 2) { first = $2; next_step = $2 } }
        if (lives == 2) { if ($2 != next_step) bad = 1; next_step++ } }
      END { exit !(lives == 2 && !bad && next_step == steps + 1) }' "$T/out/rank$rank.commits" ||
      fail "rank $rank committed: $(awk '{print $1":"$2}' "$T/out/rank$rank.commits" | tr '\n' ' ')"
  done
  for rank in 1 2 3; do
    cmp -s "$T/out/rank0.params" "$T/out/rank$rank.params" || fail "rank $rank's parameters differ"
  done
  cat "$T/node0.log" "$T/node2.log"
  echo "---- node 1 (ddprun exited $node1_code)"
  grep -E "^ddprun|no longer a member" "$T/node1.log" | cut -c1-400 | tail -n 12
  echo "PASS: node 1 cut off after step 8, node 2 took its place while the job ran and its link came back: ranks 2-3 returned in node 2's workers, node 1's old workers committed nothing more; nodes 0 and 2 exit 0, 4 ranks at step $STEPS, generation 2, bitwise equal parameters"
  ;;

stacks)
  # Two hosts in all but the kernel: each node has its own network namespace and its own
  # runtime folder (where `ddprun stacks` finds the local agent), so node 0's `ddprun stacks`
  # gets node 1's stacks only through the job's authenticated store.
  command -v eu-stack >/dev/null || skip "no eu-stack (apt-get install elfutils)"
  setup_nodes 2
  echo "stacks-$TAG" >"$T/token"
  chmod 600 "$T/token"
  # The failing node asks the other for its workers' stacks within DDPRUN_STACKS_TIMEOUT_S
  # (default 5 s; the other node captures within 4/5 of it). Under a loaded test run eu-stack on
  # three workers took longer, and node 1's report had only its own rank: 20 s leaves room.
  export DDPRUN_STACKS_TIMEOUT_S=20
  for node in 0 1; do
    export DDPRUN_RUNTIME_DIR="$T/rt$node"
    start_agent "$node" "node$node" --nnodes 2 --nproc-per-node 2 "${C10D[@]}" \
      --rdzv-id "stacks$TAG" --rdzv-conf "join_timeout=60,token_file=$T/token" \
      --no-python /bin/sleep 120
    pids[node]=$LAST_PID
  done
  unset DDPRUN_RUNTIME_DIR
  wait_grep 60 "rendezvous round 0" "$T/node0.log" "$T/node1.log"
  for ((k = 0; k < 60; k++)); do
    ip netns exec "$(ns_of 0)" env DDPRUN_RUNTIME_DIR="$T/rt0" \
      "$DDPRUN" stacks --run-id "stacks$TAG" --timeout 10 >"$T/stacks.log" 2>&1
    grep -q "4 ranks from 2 of 2 nodes" "$T/stacks.log" && grep -q "nanosleep" "$T/stacks.log" &&
      break
    sleep 0.5
  done
  expect_in "$T/stacks.log" "ddprun stacks: run 'stacks$TAG', 4 ranks from 2 of 2 nodes"
  expect_in "$T/stacks.log" "ranks 0-3 (4 of 4), eu-stack"
  expect_in "$T/stacks.log" "nanosleep"
  # A worker of node 1 killed: node 1's failure report shows where the 3 others were, node 0's
  # two included (asked through the store before the job stops).
  victim=$(ip netns pids "$(ns_of 1)" | while read -r p; do
    [[ $(cat "/proc/$p/comm" 2>/dev/null) == sleep ]] && echo "$p"; done | head -n 1)
  [[ -n "$victim" ]] || fail "no worker found in node 1's namespace"
  kill -9 "$victim"
  for node in 0 1; do wait_exit "${pids[node]}" 60 && fail "node $node ended 0 after a worker died"; done
  expect_in "$T/node1.log" "ddprun: stacks of the running workers, folded"
  grep -qE "ranks [0-9,-]+ \(3 of 3\), eu-stack" "$T/node1.log" ||
    fail "node 1's failure report lacks the 3 running ranks of both nodes"
  # The same for Python workers (py-spy): each node's worker sleeps in wait_here(); node 0's
  # `ddprun stacks` names that function and line for both ranks.
  command -v "$(dirname "$PY")/py-spy" >/dev/null || command -v py-spy >/dev/null ||
    skip "no py-spy beside $PY or on PATH (scripts/install-deps.sh installs it)"
  printf 'import time\n\n\ndef wait_here():\n    time.sleep(120)\n\n\nwait_here()\n' \
    >"$T/wait_here.py"
  for node in 0 1; do
    export DDPRUN_RUNTIME_DIR="$T/rt$node"
    start_agent "$node" "pynode$node" --nnodes 2 --nproc-per-node 1 "${C10D[@]}" \
      --rdzv-id "pystacks$TAG" --rdzv-conf "join_timeout=60,token_file=$T/token" \
      "$PY" "$T/wait_here.py"
    pids[node]=$LAST_PID
  done
  unset DDPRUN_RUNTIME_DIR
  wait_grep 60 "rendezvous round 0" "$T/pynode0.log" "$T/pynode1.log"
  for ((k = 0; k < 60; k++)); do
    ip netns exec "$(ns_of 0)" env DDPRUN_RUNTIME_DIR="$T/rt0" \
      "$DDPRUN" stacks --run-id "pystacks$TAG" --timeout 10 >"$T/pystacks.log" 2>&1
    grep -q "2 ranks from 2 of 2 nodes" "$T/pystacks.log" &&
      grep -q "wait_here.py:5" "$T/pystacks.log" && break
    sleep 0.5
  done
  expect_in "$T/pystacks.log" "ddprun stacks: run 'pystacks$TAG', 2 ranks from 2 of 2 nodes"
  expect_in "$T/pystacks.log" "ranks 0,1 (2 of 2), py-spy"
  expect_in "$T/pystacks.log" "ranks 0,1 were in wait_here at wait_here.py:5"
  for node in 0 1; do kill -TERM "${pids[node]}"; done
  for node in 0 1; do wait_exit "${pids[node]}" 60 || true; done
  echo "PASS: ddprun stacks on node 0 folded the stacks of both nodes' workers (node 1's through the store), C++ and Python; node 1's failure report has both nodes' running workers"
  ;;

*)
  echo "unknown scenario '$SCENARIO'"
  exit 2
  ;;
esac
