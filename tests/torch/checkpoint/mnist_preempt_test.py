#!/usr/bin/env python3
"""The mnist example preempted through ddprun, three ways: SIGUSR1 to ddprun (listed in
--signals-to-handle: forwarded to every worker, ddprun keeps running), SIGUSR1 to the worker of
rank 1 only, and SIGTERM to ddprun. Each time every rank agrees to stop after the same step N
("rank R: stop agreed after step N"), the newest complete checkpoint is step-N, rank 0 logged
steps 1..N, and ddprun exits 75 (ddp::kRequeueExitStatus). Started again with the same
checkpoint directory, the job prints "Resuming from ckpt/step-N at step N" and its losses
after the resume equal an uninterrupted run's bit for bit: no step lost or repeated.

The signal is sent once rank 0 has logged a few steps of a 1-epoch run (1875 steps), so it
always lands mid-epoch; nothing here depends on timing.

Usage: mnist_preempt_test.py --ddprun PATH --mnist PATH
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

from mnist_runs import run

REQUEUE = 75
EXTRA_STEPS = 5  # trained after the resume


def mnist_args(args, seed):
    # The losses are compared, not the accuracy: no evaluation after training.
    return [args.mnist, "--epochs", "1", "--batch-size", "16", "--seed", str(seed),
            "--test-images", "0"]


def ddprun(args):
    return [args.ddprun, "--standalone", "--nproc-per-node", "2", "--signals-to-handle",
            "SIGTERM,SIGINT,SIGUSR1"]


def losses(path):
    with open(path) as f:
        return [line.split() for line in f]


def logged_steps(path):
    try:
        with open(path) as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def worker_of_rank(parent, rank):
    """The pid of ddprun's child whose environment has RANK=rank."""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != parent:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        if f"RANK={rank}".encode() in env:
            return int(entry)
    raise AssertionError(f"no worker of rank {rank} among the children of ddprun {parent}")


def preempt(args, how, seed, work):
    cmd = ddprun(args) + mnist_args(args, seed) + ["--checkpoint-dir", "ckpt",
                                                     "--loss-log", "first.log"]
    p = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        # Bounded wait for training to be under way (a polled condition, not a timed check).
        deadline = time.monotonic() + 240
        while logged_steps(os.path.join(work, "first.log")) < 3:
            assert p.poll() is None, f"mnist ended before the signal\n{p.communicate()[0]}"
            assert time.monotonic() < deadline, "rank 0 logged no step within 240 s"
            time.sleep(0.02)
        if how == "SIGUSR1 to ddprun":
            os.kill(p.pid, signal.SIGUSR1)
        elif how == "SIGUSR1 to rank 1 only":
            os.kill(worker_of_rank(p.pid, 1), signal.SIGUSR1)
        else:
            os.kill(p.pid, signal.SIGTERM)
        out = p.communicate(timeout=300)[0]
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == REQUEUE, f"{how}: ddprun exited {p.returncode}, not {REQUEUE}\n{out}"
    stops = {int(r): int(n) for r, n in re.findall(r"rank (\d): stop agreed after step (\d+)", out)}
    assert sorted(stops) == [0, 1], f"{how}: not every rank stopped\n{out}"
    assert stops[0] == stops[1], f"{how}: ranks stopped after different steps {stops}\n{out}"
    if how == "SIGUSR1 to rank 1 only":
        assert "rank 1: stop agreed after" in out and "(SIGUSR1 here)" in out, out
        assert re.search(r"rank 0: stop agreed after step \d+ \(asked by another rank\)", out), out
    if how.startswith("SIGUSR1"):
        assert "received SIGUSR1; forwarding" not in out  # forwarded without stopping
    return stops[0], out


def one_case(args, how, seed, tmp):
    work = os.path.join(tmp, how.replace(" ", "_"))
    os.makedirs(work)
    stop, _ = preempt(args, how, seed, work)
    newest = sorted(d for d in os.listdir(os.path.join(work, "ckpt")) if d.startswith("step-"))[-1]
    assert newest == f"step-{stop:08d}", f"{how}: newest checkpoint {newest}, stop at {stop}"
    assert os.path.exists(os.path.join(work, "ckpt", newest, ".metadata")), "incomplete"
    first = losses(os.path.join(work, "first.log"))
    assert [int(s) for s, _ in first] == list(range(1, stop + 1)), f"{how}: first run logged {first}"

    total = stop + EXTRA_STEPS
    out = run(ddprun(args) + mnist_args(args, seed) + [
        "--checkpoint-dir", "ckpt", "--total-steps", str(total), "--loss-log", "resumed.log"], work)
    assert f"Resuming from ckpt/{newest} at step {stop}" in out, out
    run(ddprun(args) + mnist_args(args, seed) + ["--total-steps", str(total), "--loss-log",
                                                 "full.log"], work)
    resumed = losses(os.path.join(work, "resumed.log"))
    full = losses(os.path.join(work, "full.log"))
    assert first + resumed == full, (f"{how}: preempted + resumed losses differ from an "
                                     f"uninterrupted run's\n{first + resumed}\n{full}")
    print(f"{how}: every rank stopped after step {stop}, resumed there, {total} losses bitwise "
          "equal to an uninterrupted run's", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--mnist", required=True)
    args = ap.parse_args()
    args.ddprun, args.mnist = os.path.abspath(args.ddprun), os.path.abspath(args.mnist)
    tmp = tempfile.mkdtemp(prefix="ddp_mnist_preempt_")
    try:
        for seed, how in enumerate(["SIGUSR1 to ddprun", "SIGUSR1 to rank 1 only",
                                    "SIGTERM to ddprun"]):
            one_case(args, how, seed, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("mnist preemption: OK")


if __name__ == "__main__":
    main()
