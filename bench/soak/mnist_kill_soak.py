#!/usr/bin/env python3
"""Kill soak of the Fashion-MNIST example under ddprun's restarts.

Each run trains build/examples/mnist/mnist at 2 ranks under
`ddprun --standalone --nproc-per-node 2 --max-restarts 3` with --snapshot, and SIGKILLs one
worker once at a random moment: either a random rank after a random delay, or rank 0 while it
is writing a snapshot (tests/support/slow_snapshot_write.c, preloaded, pauses the first write
of each snapshot temporary half way, so the kill lands inside the save). A run passes when
ddprun exits 0 after exactly one restart, the job prints its test accuracy, every snapshot
file on disk verifies (SHA-256 in the zip comment, the rule of ddp::verify_zip_checksum), and
no snapshot temporary is left behind.

Usage: mnist_kill_soak.py [--runs 20] [--seed N] [--epochs 3] [--max-steps 40]
                          [--build-dir build] [--data-dir /usr/share/datasets/fashion-mnist]
Prints one JSON object per run and a summary object; exit 1 if any run failed. Plain Python.
Takes about a minute per run on a busy 2-core machine: not part of the default ctest run.
"""
import argparse
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

RUN_BOUND_S = 300

# The snapshot checksum rule (ddp::verify_zip_checksum) in Python, shared with the fault test.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "torch", "data"))
from fault_test import verify_snapshot  # noqa: E402


def workers_of(ddprun_pid):
    """{rank: pid} of ddprun's worker processes (its children with RANK in their environment)."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != ddprun_pid:
                continue
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
            if b"RANK" in env:
                out[int(env[b"RANK"])] = int(entry)
        except (OSError, ValueError, IndexError):
            pass
    return out


def one_run(args, rng, index):
    work = tempfile.mkdtemp(prefix="ddp_soak_")
    snapshot = os.path.join(work, "snapshot.pt")
    mode = "during-save" if rng.random() < 0.4 else "random"
    env = dict(os.environ, LD_PRELOAD=args.shim, SLOW_SNAPSHOT_WRITE_DELAY_MS="400")
    cmd = [args.ddprun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "3",
           args.mnist, "--epochs", str(args.epochs), "--max-steps", str(args.max_steps),
           "--snapshot", snapshot, "--data-dir", args.data_dir]
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()

    killed = None  # (rank, seconds after start, mode)
    deadline = start + RUN_BOUND_S
    if mode == "during-save":
        # The first temporary of a save that is not the very first (so a resume has something
        # to resume from, but not necessarily: either way the run must finish).
        target_epoch = rng.randint(1, args.epochs)
        pattern = os.path.join(work, f".snapshot.epoch-{target_epoch:06d}.pt.tmp-*")
        while proc.poll() is None and time.monotonic() < deadline and not killed:
            if glob.glob(pattern):
                pid = workers_of(proc.pid).get(0)
                if pid:
                    os.kill(pid, signal.SIGKILL)
                    killed = (0, time.monotonic() - start, mode)
            time.sleep(0.005)
    else:
        delay = rng.uniform(1.0, args.kill_window_s)
        while proc.poll() is None and time.monotonic() < start + delay:
            time.sleep(0.01)
        workers = workers_of(proc.pid)
        if proc.poll() is None and workers:
            rank = rng.choice(sorted(workers))
            os.kill(workers[rank], signal.SIGKILL)
            killed = (rank, time.monotonic() - start, mode)
    try:
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        code = None
    reader.join(timeout=10)
    seconds = time.monotonic() - start
    text = "".join(lines)

    problems = []
    if code != 0:
        problems.append(f"ddprun exited {code}" if code is not None else "hung past the bound")
    if killed is None:
        problems.append("no worker was killed (the run ended first)")
    restarts = len(re.findall(r"restarting the worker group", text))
    if killed is not None and restarts != 1:
        problems.append(f"{restarts} restarts, expected 1")
    accuracy = re.findall(r"test accuracy ([0-9.]+)%", text)
    if not accuracy:
        problems.append("no test accuracy line")
    resumed = re.findall(r"Resuming from \S+ at epoch (\d+)", text)
    files = sorted(glob.glob(os.path.join(work, "snapshot*.pt")))
    bad = [why for why in (verify_snapshot(f) for f in files) if why]
    problems += bad
    if not files:
        problems.append("no snapshot on disk")
    leftovers = [os.path.basename(p) for p in glob.glob(os.path.join(work, ".snapshot*"))]
    if leftovers:
        problems.append(f"temporaries left: {leftovers}")
    result = {
        "bench": "mnist_kill_soak", "run": index, "mode": mode,
        "killed_rank": killed[0] if killed else None,
        "kill_at_s": round(killed[1], 2) if killed else None,
        "resumed_epoch": int(resumed[-1]) if resumed else None,
        "exit": code, "seconds": round(seconds, 1),
        "accuracy": float(accuracy[-1]) if accuracy else None,
        "snapshots_verified": len(files) - len(bad), "snapshots": len(files),
        "ok": not problems, "problems": problems,
    }
    if problems:
        result["log_tail"] = text[-3000:]
    shutil.rmtree(work, ignore_errors=True)
    return result


def main():
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--max-steps", type=int, default=40)
    ap.add_argument("--kill-window-s", type=float, default=20.0)
    ap.add_argument("--build-dir", default=os.path.join(root, "build"))
    ap.add_argument("--data-dir", default="/usr/share/datasets/fashion-mnist")
    args = ap.parse_args()
    args.ddprun = os.path.join(args.build_dir, "apps/ddprun/ddprun")
    args.mnist = os.path.join(args.build_dir, "examples/mnist/mnist")
    args.shim = os.path.join(args.build_dir, "tests/torch/data/libslow_snapshot_write.so")
    for path in (args.ddprun, args.mnist, args.shim):
        if not os.path.exists(path):
            print(f"soak: {path} is missing; build ddprun, mnist and slow_snapshot_write first",
                  file=sys.stderr)
            return 2
    if not os.path.isdir(args.data_dir):
        print(f"soak: SKIP: no Fashion-MNIST at {args.data_dir} (apt-get install "
              "dataset-fashion-mnist)")
        return 0
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    results = []
    for i in range(args.runs):
        r = one_run(args, rng, i)
        results.append(r)
        print(json.dumps(r), flush=True)
    ok = sum(r["ok"] for r in results)
    times = sorted(r["seconds"] for r in results)
    print(json.dumps({
        "bench": "mnist_kill_soak", "summary": True, "seed": seed, "runs": len(results),
        "ok": ok, "failed": len(results) - ok,
        "during_save": sum(r["mode"] == "during-save" for r in results),
        "killed_rank0": sum(r["killed_rank"] == 0 for r in results),
        "snapshots_verified": sum(r["snapshots_verified"] for r in results),
        "snapshots": sum(r["snapshots"] for r in results),
        "median_run_s": times[len(times) // 2] if times else None,
        "min_accuracy": min((r["accuracy"] for r in results if r["accuracy"] is not None),
                            default=None),
    }), flush=True)
    return 0 if ok == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
