#!/usr/bin/env python3
"""kill -9 while background checkpoint writes are under way, 20 times: the newest complete
checkpoint always loads whole (every parameter holds its step's value), and the directory a
kill interrupted is never taken for a complete one. Every other run saves each step twice with
different values and keeps one checkpoint (issue 49, finding 6): the second save of a step
must replace the first whole or not at all.

Usage: kill_during_write_test.py --tool PATH/checkpoint_stress [--runs 20]
"""
import argparse
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time


# A published checkpoint is DIR/step-<digits>; a save in progress writes into
# DIR/step-<digits>.saving-<id> (its .metadata comes before the rename that publishes it, so
# that name must never count as a checkpoint).
PUBLISHED = re.compile(r"step-[0-9]+")


def newest_complete(d):
    steps = [n for n in os.listdir(d) if PUBLISHED.fullmatch(n)
             and os.path.exists(os.path.join(d, n, ".metadata"))]
    return max(steps) if steps else None


def save_cut_off(d):
    """A kill landed mid-save: a staging directory, or a step directory without .metadata (a
    prune removes .metadata first)."""
    return any(".saving-" in n or
               (PUBLISHED.fullmatch(n) and not os.path.exists(os.path.join(d, n, ".metadata")))
               for n in os.listdir(d))


def one_run(tool, d, rng, mode):
    p = subprocess.Popen([tool, mode, d], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while newest_complete(d) is None:  # kill only once a checkpoint exists
            if p.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"no checkpoint completed: {p.stderr.read().decode()}")
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.6))
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    interrupted = save_cut_off(d)
    v = subprocess.run([tool, "verify", d], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       text=True, timeout=120)
    if v.returncode != 0:
        raise AssertionError(f"after the kill: {v.stdout}")
    return interrupted, v.stdout.strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    ap.add_argument("--runs", type=int, default=20)
    args = ap.parse_args()
    seed = random.randrange(1 << 30)
    print(f"seed {seed}", flush=True)
    rng = random.Random(seed)
    mid_write = 0
    for i in range(args.runs):
        d = tempfile.mkdtemp(prefix="ddp_kill_ckpt_")
        try:
            mode = "save-twice" if i % 2 else "save"
            interrupted, what = one_run(args.tool, d, rng, mode)
        finally:
            shutil.rmtree(d, ignore_errors=True)
        mid_write += interrupted
        print(f"run {i} ({mode}): {what}{' (a save was cut off)' if interrupted else ''}",
              flush=True)
    # The kills must have hit writes, or the test proved nothing.
    if mid_write == 0:
        raise AssertionError("no kill landed during a write; the test exercised nothing")
    print(f"{mid_write} of {args.runs} kills cut a save off; every load was whole: OK")


if __name__ == "__main__":
    main()
