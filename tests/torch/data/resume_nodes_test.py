#!/usr/bin/env python3
"""Snapshot resume on node-local disks: the toy job on two "nodes" (two ddprun agents on this
machine, static rendezvous, each in a working directory of its own, so --snapshot snapshot.pt
names a different file on each node, as on node-local disks).

1. Node 0's directory holds snapshots up to epoch 3 (from an earlier single-node run), node 1's
   none: every rank must fail at once, naming the ranks and the fix (before, rank 0 resumed at
   epoch 3 and rank 1 started at epoch 0: the ranks ran different numbers of steps and hung).
2. After copying node 0's snapshot directory to node 1, both resume at epoch 3 and finish.

Usage: resume_nodes_test.py --ddprun PATH --toy PATH
Every wait is bounded (a hang is reported as a failure, and the processes are killed).
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "support"))
from free_ports import free_ports_below_ephemeral  # noqa: E402

EPOCHS = 6
BOUND_S = 120


def free_port():
    """A free loopback port below the ephemeral range (32768 and up), where no outgoing
    connection can take it between this check and the agents' bind, claimed against the other
    tests (tests/support/free_ports.py)."""
    return free_ports_below_ephemeral(1)


def run_nodes(args, dirs):
    """Two static agents, node i in dirs[i]; returns [(exit code or None if hung, output)]."""
    port = free_port()
    procs = []
    for node, d in enumerate(dirs):
        cmd = [args.ddprun, "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
               "--master-addr", "127.0.0.1", "--master-port", str(port), args.toy, str(EPOCHS),
               "1", "--batch-size", "64"]
        procs.append(subprocess.Popen(cmd, cwd=d, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    results = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=BOUND_S)
            results.append((p.returncode, out))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            results.append((None, out))
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--toy", required=True)
    args = ap.parse_args()
    args.ddprun, args.toy = os.path.abspath(args.ddprun), os.path.abspath(args.toy)
    failures = []
    top = tempfile.mkdtemp(prefix="ddp_resume_nodes_")
    try:
        node0, node1 = os.path.join(top, "node0"), os.path.join(top, "node1")
        os.makedirs(node0)
        os.makedirs(node1)
        # Snapshots up to epoch 3 on node 0 only.
        r = subprocess.run([args.ddprun, "--standalone", "--nproc-per-node", "2", args.toy, "3",
                            "1", "--batch-size", "64"], cwd=node0, capture_output=True,
                           text=True, timeout=BOUND_S)
        if r.returncode != 0 or not os.path.exists(os.path.join(node0, "snapshot.pt")):
            print(r.stdout + r.stderr)
            print("FAIL: could not prepare node 0's snapshots")
            return 1

        results = run_nodes(args, [node0, node1])
        for node, (code, out) in enumerate(results):
            if code is None:
                failures.append(f"node {node} hung past {BOUND_S} s with different snapshots")
            elif code == 0:
                failures.append(f"node {node} succeeded although the ranks' snapshots differ")
            for want in ["rank 0 has the snapshot at epoch 3", "rank 1 has no snapshot",
                         "a file system every node shares", "copy the snapshot directory"]:
                if want not in out:
                    failures.append(f"node {node}'s output lacks '{want}'")
            if failures:
                print(f"--- node {node} (exit {code}) ---\n{out}")
        if not failures:
            print("PASS: different snapshots on the two nodes: both fail at once, naming the "
                  "ranks and the fix")

        # The fix the message names: copy node 0's snapshot directory to node 1.
        shutil.rmtree(node1)
        shutil.copytree(node0, node1)
        results = run_nodes(args, [node0, node1])
        before = len(failures)
        for node, (code, out) in enumerate(results):
            if code != 0:
                failures.append(f"node {node} exited {code} after the snapshot was copied")
            if "Resuming training from snapshot at Epoch 3" not in out:
                failures.append(f"node {node} did not resume at epoch 3")
            if len(failures) > before:
                print(f"--- node {node} (exit {code}) ---\n{out}")
        if len(failures) == before:
            print("PASS: with the snapshot copied to node 1 both nodes resume at epoch 3 and "
                  "finish")
    finally:
        shutil.rmtree(top, ignore_errors=True)
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
