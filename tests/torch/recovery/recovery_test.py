#!/usr/bin/env python3
"""In-place recovery end to end (docs/recovery.md), real processes and real kills.

Backends cpu (shared memory; the survivors' collective is aborted by ddprun's notice) and gloo.

1 host x 3 ranks of recovery_worker under ddprun (--two-nodes: 2 simulated hosts x 2 ranks, one
agent each, kills on either node, rank 0 included):
- a run without a failure gives the reference parameters;
- 5 seeds: rank, step and phase of a kill -9 drawn from the seed; ddprun --recovery step must
  restart only that rank, the job must exit 0, every rank must end with exactly the requested
  number of committed steps, and every rank's parameters must be bitwise equal to each other and
  to the reference (no committed step lost, none applied twice);
- --recovery group (the default) with the same kill restarts the whole group, as before;
- a bad --recovery value is a usage error naming the choices.

With --zero the worker trains with ddp::ZeroRedundancyOptimizer (Adam, sharded): the same
checks, with kills inside the optimizer step too (after the dying rank stepped its shard,
before the parameter all-gather: the survivors finish that step), and with --lost-node a node
lost with its ranks' shards (their replicas live on the other node).

With --python PY --python-worker recovery_worker.py the same checks (cpu only: reference, 3
seeds, a failure in the first step, two in a row, a replacement killed while being healed; and
--two-nodes, --lost-node, --replaced-node as for C++) run PyTorch's DistributedDataParallel on
the ddp backend with ddp.StepManager.
"""
import argparse
import array
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time

# Worker environment every run gets (--zero: the ZeRO optimizer).
EXTRA_ENV = {}

WORLD = 3
TWO_NODES_WORLD = 4  # --two-nodes: 2 agents x 2 ranks
STEPS = 30


def run_two_nodes(ddprun, worker, out, env_extra, step_on=(True, True)):
    """Two agents on this machine, each a simulated host (DDP_HOST_ID: the cpu backend then runs
    shared memory within a node and the leaders' TCP ring between them, as on two machines),
    2 workers each, static rendezvous, --recovery step. Returns (exit codes, stderr of both)."""
    port = free_port()
    procs = []
    for node in range(2):
        env = dict(os.environ)
        env.update(EXTRA_ENV)
        env.update(env_extra)
        env["DDP_HOST_ID"] = f"node{node}"
        cmd = [ddprun, "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
               "--master-port", str(port), "--nproc-per-node", "2", "--max-restarts", "2"]
        cmd += ["--recovery", "step"] if step_on[node] else []
        cmd += ["--no-python"] + worker + ["--steps", str(STEPS), "--out", out]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    errs = wait_all(procs, 300)
    codes = [p.returncode for p in procs]
    return codes, "\n".join(f"--- node {i} ---\n{e}" for i, e in enumerate(errs))


def wait_all(procs, limit):
    """Waits for every process (each for at most `limit` s; one still running then kills them
    all); returns their stderr."""
    errs = []
    for p in procs:
        try:
            _, err = p.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            _, err = p.communicate()
        errs.append(err)
    return errs


def free_port():
    """A port with the next one free too (the static rendezvous uses MASTER_PORT + 1)."""
    for _ in range(100):
        with socket.socket() as a:
            a.bind(("", 0))
            port = a.getsockname()[1]
            if port >= 65535:
                continue
            try:
                with socket.socket() as b:
                    b.bind(("", port + 1))
                return port
            except OSError:
                continue
    raise RuntimeError("no two adjacent free ports")


def two_nodes(ddprun, worker, tmp):
    """--recovery step over two nodes x 2 ranks (docs/recovery.md): each node's agent restarts
    its own failed worker and records the loss in the store that node 0's agent hosts; the
    survivors on both nodes drop the step within the notice's bound and re-form."""
    ref_dir = os.path.join(tmp, "two_nodes_reference")
    os.makedirs(ref_dir)
    codes, err = run_two_nodes(ddprun, worker, ref_dir, {})
    if codes != [0, 0]:
        fail(f"two nodes: the run without a failure exited {codes}\n{err}")
    reference = read_params(ref_dir, TWO_NODES_WORLD)
    if len(set(reference)) != 1:
        fail("two nodes: ranks differ after a run without a failure")
    # Rank 3 and rank 2 (node 1's leader, in the ring between the nodes), rank 0 (on the node
    # whose agent hosts the store), then two failures in a row, one on each node.
    for name, steps, ranks, phase, generations in [
            ("rank 3, backward", "7", "3", "backward", 1),
            ("rank 2 (node 1's leader), forward", "12", "2", "forward", 1),
            ("rank 0 (node 0, which hosts the store), between", "5", "0", "between", 1),
            ("two failures in a row on both nodes", "4,10", "1,3", "backward", 2)]:
        out = os.path.join(tmp, "two_nodes_" + name.split(",")[0].replace(" ", "_") +
                           str(generations))
        os.makedirs(out)
        codes, err = run_two_nodes(ddprun, worker, out, {
            "DDP_TEST_KILL_AT_STEP": steps, "DDP_TEST_KILL_RANK": ranks,
            "DDP_TEST_KILL_PHASE": phase})
        what = f"two nodes, kill -9 of {name} at step {steps}"
        if codes != [0, 0]:
            fail(f"{what}: the agents exited {codes}\n{err}")
        for rank in ranks.split(","):
            if f"restarting only rank {rank}" not in err:
                fail(f"{what}: rank {rank} was not restarted alone\n{err}")
        if "timed out" in err or "restarting the worker group" in err:
            fail(f"{what}: a timeout or a group restart\n{err}")
        reports = read_reports(out, TWO_NODES_WORLD)
        if any(r["step"] != STEPS or r["generation"] != generations for r in reports):
            fail(f"{what}: reports {reports}\n{err}")
        params = read_params(out, TWO_NODES_WORLD)
        if len(set(params)) != 1 or params[0] != reference[0]:
            fail(f"{what}: parameters differ between ranks or from the reference\n{err}")
        print(f"ok: {what}: both agents exit 0, generation {generations}, parameters of all "
              f"{TWO_NODES_WORLD} ranks bitwise equal to the reference")
    # Node 0 without --recovery step: node 1's agent must not take rank 0's own store for the
    # job's step store; it says so and the job ends.
    out = os.path.join(tmp, "two_nodes_mismatch")
    os.makedirs(out)
    codes, err = run_two_nodes(ddprun, worker, out, {}, step_on=(False, True))
    if codes[1] == 0 or "the node running rank 0 runs without --recovery step (give every " \
            "node the same --recovery)" not in err:
        fail(f"node 0 without --recovery step: the agents exited {codes}\n{err}")
    print(f"ok: node 0 without --recovery step: node 1's agent refuses (exit {codes[1]}) naming "
          f"the mismatch")
    print("PASS")


LOST_NODE_KILL_STEP = 8
# Measured 7e-8: float rounding (the survivors add the same shares in another order).
LOST_NODE_TOLERANCE = 1e-5


def read_commits(out, slot):
    """[(pid, step, world size)] of every step rank `slot` committed, in order."""
    with open(os.path.join(out, f"rank{slot}.commits")) as f:
        return [tuple(int(v) for v in line.split()) for line in f if line.strip()]


def start_elastic_agent(ddprun, worker, out, run_id, port, host, env_extra, steps=STEPS,
                        stderr=subprocess.PIPE):
    """One agent (simulated host `host`) x 2 ranks of an elastic c10d job (--nnodes 1:2) on
    loopback, heartbeat 1 s, --recovery step, dropout off (DDP_TEST_DROPOUT=0: the parameters of
    a run that lost a node can then be compared with a run that did not)."""
    env = dict(os.environ)
    env["DDP_HOST_ID"] = host
    env["DDP_TEST_DROPOUT"] = "0"
    env.update(EXTRA_ENV)
    env.update(env_extra)
    cmd = [ddprun, "--nnodes", "1:2", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id,
           "--rdzv-conf", "heartbeat=1,last_call_timeout=10", "--recovery", "step",
           "--max-restarts", "2", "--no-python"] + worker + [
           "--steps", str(steps), "--out", out]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True,
                            start_new_session=True)


def start_elastic_pair(ddprun, worker, out, run_id, node1_env, steps=STEPS, env=None):
    """Two agents (node0, node1, start_elastic_agent), both with `env`, node 1 also with
    `node1_env`. Node 0 joins first, so it hosts the stores and is the round's node 0."""
    port = free_port()
    procs = []
    for node in range(2):
        node_env = dict(env or {}, **(node1_env if node == 1 else {}))
        procs.append(start_elastic_agent(ddprun, worker, out, run_id, port, f"node{node}",
                                         node_env, steps))
        if node == 0:
            time.sleep(1.0)
    return procs, wait_all(procs, 240)


def expect_reports(out, world, steps, generation, what, err):
    """Fails unless ranks 0..world-1 each ended at `steps` committed steps, in a group of
    `world` ranks at membership generation `generation`."""
    reports = read_reports(out, world)
    if any(r["step"] != steps or r["generation"] != generation or r["world_size"] != world
           for r in reports):
        fail(f"{what}: reports {reports}\n{err}")


def expect_equal_params_near(out, world, reference, what, err):
    """Fails unless ranks 0..world-1 hold bitwise equal parameters within LOST_NODE_TOLERANCE
    (relative) of `reference`, a run that lost no node; returns that distance."""
    params = read_params(out, world)
    if len(set(params)) != 1:
        fail(f"{what}: the ranks' parameters differ\n{err}")
    drift = relative_error(params[0], reference)
    if drift > LOST_NODE_TOLERANCE:
        fail(f"{what}: the parameters are {drift:.3g} (relative) from the run that lost no node "
             f"(limit {LOST_NODE_TOLERANCE})\n{err}")
    return drift


def relative_error(a, b):
    """The relative L2 distance of two parameter dumps (float32 bytes)."""
    x, y = array.array("f", a), array.array("f", b)
    num = sum((p - q) ** 2 for p, q in zip(x, y)) ** 0.5
    return num / (sum(q * q for q in y) ** 0.5)


def lost_node(ddprun, worker, tmp):
    """A whole node lost in an elastic c10d job (--nnodes 1:2) under --recovery step: node 1's
    rank 2 SIGKILLs its agent (its other worker dies with it) and itself after committing step
    LOST_NODE_KILL_STEP. Node 0's agent sees the missed heartbeats and takes ranks 2-3 out of
    the job; its workers drop the step in flight, re-form as ranks 0-1 of 2 and finish, each
    also training on a lost rank's share of the global batch. Checked: node 0 exits 0 without a
    group restart; each survivor committed every step exactly once, in one process, at world
    size 4 up to the kill step and at 2 after it; both end at generation 1, world size 2, with
    bitwise equal parameters, within float rounding of a run that lost no node (same global
    batches, averaged over the survivors).

    The same for Python (PyTorch's DDP on the ddp backend with ddp.StepManager): the default
    group re-forms with fewer ranks in the same c10d process group object, whose
    torch.distributed rank and size stay the launch's while StepManager.rank and world_size
    follow the generation."""
    what = f"lost node (node 1 killed after step {LOST_NODE_KILL_STEP})"
    ref_dir = os.path.join(tmp, "lost_node_reference")
    os.makedirs(ref_dir)
    procs, errs = start_elastic_pair(ddprun, worker, ref_dir, "lost_node_ref", {})
    if [p.returncode for p in procs] != [0, 0]:
        fail(f"{what}: the reference run exited {[p.returncode for p in procs]}\n" +
             "\n".join(errs))
    reference = read_params(ref_dir, 4)
    if len(set(reference)) != 1:
        fail(f"{what}: the reference's ranks differ")
    out = os.path.join(tmp, "lost_node")
    os.makedirs(out)
    procs, (err0, err1) = start_elastic_pair(
        ddprun, worker, out, "lost_node",
        {"DDP_TEST_KILL_NODE_AT_STEP": str(LOST_NODE_KILL_STEP)})
    err = f"--- node 0 ---\n{err0}\n--- node 1 ---\n{err1}"
    if procs[0].returncode != 0:
        fail(f"{what}: node 0's agent exited {procs[0].returncode}\n{err}")
    if procs[1].returncode != -signal.SIGKILL:
        fail(f"{what}: node 1's agent ended with {procs[1].returncode}, not SIGKILL\n{err}")
    if "its ranks 2-3 leave the job and the other 2 workers go on" not in err0:
        fail(f"{what}: node 0 did not take the loss in place\n{err}")
    # (The flight recorder's wait for the dead ranks' records times out, by design.)
    timeouts = [line for line in err0.splitlines()
                if "timed out" in line and "flight recorder" not in line]
    if "restarting the worker group" in err0 or timeouts:
        fail(f"{what}: a group restart or a timeout\n{err}")
    expect_reports(out, 2, STEPS, 1, what, err)
    if EXTRA_ENV and "both the owner and the replica" in err0:
        fail(f"{what}: ZeRO lost a shard's optimizer state with the node (its replica must live "
             f"on the other node)\n{err}")
    for slot in range(2):
        commits = read_commits(out, slot)
        steps = [step for _, step, _ in commits]
        worlds = [world for _, _, world in commits]
        if steps != list(range(1, STEPS + 1)) or len({pid for pid, _, _ in commits}) != 1:
            fail(f"{what}: rank {slot} committed {commits}\n{err}")
        # Steps 1..KILL at world size 4, every later one at 2 (step KILL + 1 was dropped and
        # redone by the survivors). With ZeRO, the loss can also cut step KILL inside the
        # optimizer step (node 1 committed it, node 0's parameter all-gather lacked the dying
        # node's part): the survivors roll it forward after re-forming, so it is logged at
        # world size 2, and this rank says so.
        expected = [4] * LOST_NODE_KILL_STEP + [2] * (STEPS - LOST_NODE_KILL_STEP)
        rolled = [4] * (LOST_NODE_KILL_STEP - 1) + [2] * (STEPS - LOST_NODE_KILL_STEP + 1)
        cut = f"rank {slot}: step {LOST_NODE_KILL_STEP - 1} cut in the optimizer step"
        if worlds != expected and not (EXTRA_ENV and worlds == rolled and cut in err0):
            fail(f"{what}: rank {slot}'s world sizes per step {worlds}\n{err}")
    drift = expect_equal_params_near(out, 2, reference[0], what, err)
    print(f"ok: {what}: node 0 exits 0, ranks 0-1 went on at world size 2 from step "
          f"{LOST_NODE_KILL_STEP + 1}, each step committed once, parameters bitwise equal on "
          f"both and {drift:.3g} (relative) from the run that lost no node")
    print("PASS")


REPLACED_NODE_STEPS = 60


def wait_for_line(path, text, limit):
    """Waits until the file at `path` holds `text` (at most `limit` s); returns whether it did."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with open(path) as f:
            if text in f.read():
                return True
        time.sleep(0.05)
    return False


def wait_for_commits_at_world(path, world, count, limit):
    """Waits until the commit log at `path` ("pid step world" lines) holds `count` steps
    committed at world size `world` (at most `limit` s); returns whether it did."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                worlds = [line.split()[2] for line in f if len(line.split()) == 3]
            if worlds.count(str(world)) >= count:
                return True
        time.sleep(0.05)
    return False


def replaced_node(ddprun, worker, tmp, python=False):
    """A lost node replaced while the job runs: as lost_node (node 1 killed after step
    LOST_NODE_KILL_STEP, the survivors go on at world size 2), then a third agent (node2, 2
    workers) starts: it takes node 1's place in the running round, its workers come back as
    ranks 2-3 healed from a live peer, and the survivors re-form at world size 4 without a
    group restart (node2 starts once the survivors committed 3 steps at world size 2). The
    workers sleep DDP_TEST_STEP_SLEEP_MS after each step so that the job is still running when
    node2 arrives. Checked: every agent but node 1 exits 0, nobody
    restarts the worker group; ranks 0-1 commit every step once in one process, at world size 4,
    then 2, then 4 again; ranks 2-3's new processes commit every step from their return to the
    end at world size 4; all four end at generation 2, world size 4, with bitwise equal
    parameters, within float rounding of a run that lost no node. python: the workers sleep
    longer (a Python worker takes seconds to import torch, and node2's must join while the job
    still runs)."""
    steps = REPLACED_NODE_STEPS
    what = f"replaced node (node 1 killed after step {LOST_NODE_KILL_STEP}, node2 takes its place)"
    ref_dir = os.path.join(tmp, "replaced_node_reference")
    os.makedirs(ref_dir)
    sgd = {"DDP_TEST_OPTIMIZER": "sgd"}  # Adam turns rounding into step-size differences
    procs, errs = start_elastic_pair(ddprun, worker, ref_dir, "replaced_ref", {}, steps, sgd)
    if [p.returncode for p in procs] != [0, 0]:
        fail(f"{what}: the reference run exited {[p.returncode for p in procs]}\n" +
             "\n".join(errs))
    reference = read_params(ref_dir, 4)

    out = os.path.join(tmp, "replaced_node")
    os.makedirs(out)
    port = free_port()
    slow = dict(sgd, DDP_TEST_STEP_SLEEP_MS="400" if python else "150")
    logs = [os.path.join(tmp, f"replaced_node{i}.err") for i in range(3)]
    files = [open(path, "w") for path in logs]
    procs = [start_elastic_agent(ddprun, worker, out, "replaced", port, "node0", slow, steps,
                                 files[0])]
    time.sleep(1.0)
    procs.append(start_elastic_agent(
        ddprun, worker, out, "replaced", port, "node1",
        dict(slow, DDP_TEST_KILL_NODE_AT_STEP=str(LOST_NODE_KILL_STEP)), steps, files[1]))
    taken = wait_for_line(logs[0], "its ranks 2-3 leave the job", 120)
    if taken:
        # node2 comes once the survivors committed a few steps at world size 2 (bounded; late,
        # the checks below say so).
        wait_for_commits_at_world(os.path.join(out, "rank0.commits"), 2, 3, 120)
        procs.append(start_elastic_agent(ddprun, worker, out, "replaced", port, "node2", slow,
                                         steps, files[2]))
    wait_all(procs, 240)
    for f in files:
        f.close()
    err0, err1, err2 = (open(path).read() for path in logs)
    err = f"--- node 0 ---\n{err0}\n--- node 1 ---\n{err1}\n--- node 2 ---\n{err2}"
    if not taken:
        fail(f"{what}: node 0 did not take node 1's loss in place\n{err}")
    codes = [p.returncode for p in procs]
    if codes != [0, -signal.SIGKILL, 0]:
        fail(f"{what}: the agents exited {codes} (expected 0, SIGKILL, 0)\n{err}")
    if "this node takes the place of node 1, lost while the job ran: ranks 2-3 come back" \
            not in err2:
        fail(f"{what}: node2 did not take node 1's place\n{err}")
    if any("restarting the worker group" in e for e in (err0, err2)):
        fail(f"{what}: a group restart\n{err}")
    expect_reports(out, 4, steps, 2, what, err)
    for slot in range(2):
        commits = read_commits(out, slot)
        worlds = [world for _, _, world in commits]
        shrunk = worlds.count(2)
        if [step for _, step, _ in commits] != list(range(1, steps + 1)) or \
                len({pid for pid, _, _ in commits}) != 1 or shrunk == 0 or \
                worlds != [4] * LOST_NODE_KILL_STEP + [2] * shrunk + \
                [4] * (steps - LOST_NODE_KILL_STEP - shrunk):
            fail(f"{what}: rank {slot} committed {commits}\n{err}")
    back_at = None
    for slot in (2, 3):
        commits = read_commits(out, slot)
        first_life = [c for c in commits if c[0] == commits[0][0]]
        second_life = commits[len(first_life):]
        if [step for _, step, _ in first_life] != list(range(1, LOST_NODE_KILL_STEP + 1)):
            fail(f"{what}: rank {slot}'s first process committed {first_life}\n{err}")
        if not second_life or len({pid for pid, _, _ in second_life}) != 1 or \
                [step for _, step, _ in second_life] != \
                list(range(second_life[0][1], steps + 1)) or \
                any(world != 4 for _, _, world in second_life):
            fail(f"{what}: rank {slot}'s new process committed {second_life}\n{err}")
        back_at = second_life[0][1]
    drift = expect_equal_params_near(out, 4, reference[0], what, err)
    print(f"ok: {what}: ranks 0-1 went on at world size 2 from step {LOST_NODE_KILL_STEP + 1}, "
          f"ranks 2-3 came back in node2's processes from step {back_at}, each step committed "
          f"once per process, no group restart, parameters bitwise equal on all 4 and "
          f"{drift:.3g} (relative) from the run that lost no node")
    print("PASS")


def killed_after_last_step(ddprun, worker, tmp):
    """Rank 1 killed right after the job's last step committed, while ranks 0 and 2 finish and
    exit 0. ddprun restarts it (its peers had not exited yet), but no live peer is left to heal
    the replacement: the job must fail at once, saying so, not after the worker's 60 s group
    timeout with "ranks [0, 2] never did (1 of 3 joined)"."""
    what = "rank 1 killed after the job's last step"
    out = os.path.join(tmp, "killed_after_last_step")
    os.makedirs(out)
    start = time.monotonic()
    p = run(ddprun, worker, out, "step", {
        "DDP_TEST_KILL_AT_STEP": str(STEPS), "DDP_TEST_KILL_RANK": "1",
        "DDP_TEST_KILL_PHASE": "between"})
    took = time.monotonic() - start
    if p.returncode == 0:
        fail(f"{what}: ddprun exited 0, though rank 1's end of run was lost", p)
    if "never did" in p.stderr or "timed out" in p.stderr:
        fail(f"{what}: the replacement waited out the group timeout", p)
    # A hang detector (the run itself takes seconds; the group timeout is 60 s).
    if took > 30:
        fail(f"{what}: the job took {took:.0f} s to fail", p)
    if "restarting only rank 1" in p.stderr:
        expected = ("rank 1 of 3 cannot rejoin the job: ranks 0 and 2 already finished (closed "
                    "their group without an error, after their last step)")
        if expected not in p.stderr or "no live peer is left to heal it from" not in p.stderr:
            fail(f"{what}: the replacement's failure does not name the finished peers", p)
        how = "the replacement refused to rejoin its finished peers"
    else:
        # A peer had exited already when ddprun reaped rank 1: it did not restart it at all.
        how = "ddprun did not restart it (a peer had already exited)"
    print(f"ok: {what}: exit {p.returncode} after {took:.1f} s; {how}")


def run(ddprun, worker, out, recovery, env_extra):
    """worker: the command (a list) that runs one rank."""
    env = dict(os.environ)
    env.update(EXTRA_ENV)
    env.update(env_extra)
    cmd = [ddprun, "--standalone", "--nproc-per-node", str(WORLD), "--max-restarts", "2"]
    if recovery:
        cmd += ["--recovery", recovery]
    cmd += ["--no-python"] + worker + ["--steps", str(STEPS), "--out", out]
    p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=300)
    return p


def read_params(out, world=WORLD):
    return [open(os.path.join(out, f"rank{r}.params"), "rb").read() for r in range(world)]


def read_reports(out, world=WORLD):
    return [json.load(open(os.path.join(out, f"rank{r}.json"))) for r in range(world)]


def fail(msg, p=None):
    print("FAIL:", msg)
    if p is not None:
        print("--- stdout ---\n" + p.stdout[-4000:])
        print("--- stderr ---\n" + p.stderr[-8000:])
    sys.exit(1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--worker", help="the C++ recovery_worker")
    ap.add_argument("--python", help="the interpreter for --python-worker")
    ap.add_argument("--python-worker", help="tests/python/recovery_worker.py")
    ap.add_argument("--two-nodes", action="store_true",
                    help="two agents (simulated hosts) x 2 ranks instead of one x 3")
    ap.add_argument("--lost-node", action="store_true",
                    help="two agents (simulated hosts) x 2 ranks, c10d 1:2; node 1 is lost")
    ap.add_argument("--zero", action="store_true",
                    help="train with ddp::ZeroRedundancyOptimizer (kills in its step too)")
    ap.add_argument("--replaced-node", action="store_true",
                    help="as --lost-node, then a third agent takes the lost node's place")
    args = ap.parse_args()
    if args.zero:
        EXTRA_ENV["DDP_TEST_OPTIMIZER"] = "zero_adam"
    python = args.python_worker is not None
    if python == (args.worker is not None) or (python and not args.python):
        ap.error("give --worker, or --python and --python-worker")
    args.worker = [args.python, args.python_worker] if python else [args.worker]
    tmp = tempfile.mkdtemp(prefix="ddp_recovery_test_")
    if args.two_nodes:
        two_nodes(args.ddprun, args.worker, tmp)
        return
    if args.lost_node:
        lost_node(args.ddprun, args.worker, tmp)
        return
    if args.replaced_node:
        replaced_node(args.ddprun, args.worker, tmp, python)
        return

    # Reference: no failure.
    ref_dir = os.path.join(tmp, "reference")
    os.makedirs(ref_dir)
    p = run(args.ddprun, args.worker, ref_dir, "step", {})
    if p.returncode != 0:
        fail(f"the run without a failure exited {p.returncode}", p)
    reference = read_params(ref_dir)
    if len(set(reference)) != 1:
        fail("ranks differ after a run without a failure")
    print(f"reference: {STEPS} steps, {len(reference[0])} parameter bytes per rank")

    phases = ["forward", "backward", "between"]
    if args.zero:
        phases = ["optimizer", "forward", "backward", "between"]
    for seed in range(3 if python else 5):
        rnd = random.Random(seed)
        kill_rank = seed % WORLD  # rank 0 too: the store lives in ddprun, not in rank 0
        kill_step = rnd.randrange(1, STEPS - 1)
        phase = phases[seed % len(phases)]
        out = os.path.join(tmp, f"seed{seed}")
        os.makedirs(out)
        p = run(args.ddprun, args.worker, out, "step", {
            "DDP_TEST_KILL_AT_STEP": str(kill_step),
            "DDP_TEST_KILL_RANK": str(kill_rank),
            "DDP_TEST_KILL_PHASE": phase,
        })
        what = f"seed {seed} (kill -9 of rank {kill_rank} at step {kill_step}, {phase})"
        if p.returncode != 0:
            fail(f"{what}: ddprun exited {p.returncode}", p)
        if f"restarting only rank {kill_rank}" not in p.stderr:
            fail(f"{what}: ddprun did not restart rank {kill_rank} alone", p)
        if "restarting the worker group" in p.stderr:
            fail(f"{what}: ddprun restarted the whole group", p)
        # The survivors' collective in flight ended by ddprun's notice (PeerLostError), not by
        # the group timeout (a TimeoutError message).
        lost = f"rank {kill_rank} of {WORLD} was lost (membership generation 1"
        if p.stderr.count(lost) < WORLD - 1 or "timed out" in p.stderr:
            fail(f"{what}: the survivors did not drop the step on ddprun's notice", p)
        reports = read_reports(out)
        for r in reports:
            if r["step"] != STEPS:
                fail(f"{what}: rank {r['rank']} committed {r['step']} steps, not {STEPS}", p)
        restarted = reports[kill_rank]
        if restarted["restart_count"] != 1 or restarted["generation"] != 1:
            fail(f"{what}: the restarted rank reports {restarted}", p)
        survivors = [r for r in reports if r["rank"] != kill_rank]
        if any(r["recoveries"] != 1 for r in survivors):
            fail(f"{what}: survivors did not re-form exactly once: {survivors}", p)
        params = read_params(out)
        if len(set(params)) != 1:
            fail(f"{what}: parameters differ between ranks", p)
        if params[0] != reference[0]:
            fail(f"{what}: parameters differ from the run without a failure (a step lost or "
                 f"applied twice)", p)
        print(f"ok: {what}: exit 0, {STEPS} steps on every rank, parameters bitwise equal "
              f"to each other and to the reference; survivors dropped "
              f"{[r['dropped'] for r in survivors]} attempts")

    # A failure in the first step, two failures in a row (the second rank dies after the first
    # one was healed; --max-restarts 2 covers both), and
    # A replacement killed while the survivors heal it (before its attach()).
    for name, steps, ranks, phase, generations, in_heal in [
            ("first step", "0", "2", "forward", 1, "0"),
            ("two failures in a row", "4,9", "1,2", "backward", 2, "0"),
            ("replacement killed while being healed", "6", "1", "backward", 2, "1")]:
        out = os.path.join(tmp, name.replace(" ", "_"))
        os.makedirs(out)
        p = run(args.ddprun, args.worker, out, "step", {
            "DDP_TEST_KILL_AT_STEP": steps, "DDP_TEST_KILL_RANK": ranks,
            "DDP_TEST_KILL_PHASE": phase, "DDP_TEST_KILL_IN_HEAL": in_heal})
        if p.returncode != 0:
            fail(f"{name}: ddprun exited {p.returncode}", p)
        reports = read_reports(out)
        if any(r["step"] != STEPS or r["generation"] != generations for r in reports):
            fail(f"{name}: reports {reports}", p)
        params = read_params(out)
        if len(set(params)) != 1 or params[0] != reference[0]:
            fail(f"{name}: parameters differ between ranks or from the reference", p)
        print(f"ok: {name}: exit 0, generation {generations}, parameters bitwise equal to the "
              f"reference")

    if python:
        print("PASS")
        return

    killed_after_last_step(args.ddprun, args.worker, tmp)

    # The gloo backend: the collective in flight ends on the dead peer's socket, the notice
    # confirms the loss. Its own reference (gloo sums in another order than cpu).
    gloo_ref_dir = os.path.join(tmp, "gloo_reference")
    os.makedirs(gloo_ref_dir)
    p = run(args.ddprun, args.worker, gloo_ref_dir, "step", {"DDP_TEST_BACKEND": "gloo"})
    if p.returncode != 0:
        fail(f"gloo: the run without a failure exited {p.returncode}", p)
    gloo_reference = read_params(gloo_ref_dir)
    for seed in (5, 6):
        rnd = random.Random(seed)
        kill_rank = 0 if seed == 5 else 2
        kill_step = rnd.randrange(1, STEPS - 1)
        out = os.path.join(tmp, f"gloo_seed{seed}")
        os.makedirs(out)
        p = run(args.ddprun, args.worker, out, "step", {
            "DDP_TEST_BACKEND": "gloo", "DDP_TEST_KILL_AT_STEP": str(kill_step),
            "DDP_TEST_KILL_RANK": str(kill_rank), "DDP_TEST_KILL_PHASE": "backward"})
        what = f"gloo, kill -9 of rank {kill_rank} at step {kill_step}"
        if p.returncode != 0:
            fail(f"{what}: ddprun exited {p.returncode}", p)
        reports = read_reports(out)
        if any(r["step"] != STEPS or r["generation"] != 1 for r in reports):
            fail(f"{what}: reports {reports}", p)
        params = read_params(out)
        if len(set(params)) != 1 or params[0] != gloo_reference[0]:
            fail(f"{what}: parameters differ between ranks or from the gloo reference", p)
        print(f"ok: {what}: exit 0, parameters bitwise equal to the gloo reference")

    # --recovery group (explicit) and the default: the whole group restarts, as before.
    for recovery in ["group", None]:
        out = os.path.join(tmp, f"group_{recovery}")
        os.makedirs(out)
        p = run(args.ddprun, args.worker, out, recovery, {
            "DDP_TEST_KILL_AT_STEP": "5", "DDP_TEST_KILL_RANK": "1",
            "DDP_TEST_KILL_PHASE": "backward"})
        if p.returncode != 0:
            fail(f"--recovery {recovery}: exited {p.returncode}", p)
        if "restarting the worker group (restart 1 of 2)" not in p.stderr:
            fail(f"--recovery {recovery}: the group was not restarted as before", p)
        if "restarting only rank" in p.stderr:
            fail(f"--recovery {recovery}: a rank was restarted alone", p)
        if any(r["restart_count"] != 1 for r in read_reports(out)):
            fail(f"--recovery {recovery}: not every rank is of the restarted group", p)
        print(f"ok: --recovery {recovery or '(default)'} restarts the whole group")

    # A bad value: usage error, exit 2, naming the choices.
    p = subprocess.run([args.ddprun, "--recovery", "later", "--standalone", "--no-python",
                        "true"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                       timeout=60)
    if p.returncode != 2 or "--recovery 'later': unknown recovery mode; use 'group'" not in \
            p.stderr or "'step'" not in p.stderr:
        fail(f"a bad --recovery value: exit {p.returncode}", p)
    print("ok: a bad --recovery value is a usage error")
    print("PASS")


if __name__ == "__main__":
    main()
