#!/usr/bin/env python3
"""Fault tolerance of the toy job under ddprun --max-restarts: SIGKILL workers at random
moments and rank 0 in the middle of writing a snapshot; every run must restart, resume from the
newest valid snapshot, finish all epochs with the same final parameters as an uninterrupted
run, and never leave a snapshot that fails its checksum.

Usage: fault_test.py --ddprun PATH --toy PATH --slow-write LIB [--kills 20] [--seed N]
Plain Python (no torch needed): the checksum is verified from the zip comment with hashlib.
"""
import argparse
import glob
import hashlib
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

EPOCHS = 8
DIGEST = re.compile(r"Training finished \| epochs \d+ \| parameters ([0-9a-f]+)")
PREFIX = b"ddp-snapshot sha256="


def verify_snapshot(path):
    """Same rule as ddp::verify_zip_checksum: sha256 of the file with its comment removed."""
    data = open(path, "rb").read()
    clen = 22 + len(PREFIX) + 64
    if len(data) < clen or data[-clen:-clen + 4] != b"PK\x05\x06":
        return f"{path}: no end-of-central-directory record ({len(data)} bytes)"
    comment = data[-(len(PREFIX) + 64):]
    if not comment.startswith(PREFIX):
        return f"{path}: no ddp checksum comment"
    original = bytearray(data[:-(len(PREFIX) + 64)])
    original[-2:] = b"\x00\x00"
    if hashlib.sha256(original).hexdigest() != comment[len(PREFIX):].decode():
        return f"{path}: checksum mismatch"
    return None


def children(pid):
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    out.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return out


def start(args, workdir, env=None):
    cmd = [args.ddprun, "--standalone", "--nproc-per-node", "2", "--max-restarts", "3",
           args.toy, str(EPOCHS), "1", "--batch-size", "8", "--snapshot",
           os.path.join(workdir, "snapshot.pt")]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, **(env or {})))


class Output:
    """Collects a process's output lines on a thread, so the test can wait for a line."""

    def __init__(self, proc):
        self.lines = []
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.thread.start()

    def _read(self, proc):
        for line in proc.stdout:
            with self.cond:
                self.lines.append(line)
                self.cond.notify_all()

    def wait_for(self, text, timeout=60):
        with self.cond:
            return self.cond.wait_for(lambda: any(text in l for l in self.lines), timeout)

    def text(self):
        self.thread.join()
        return "".join(self.lines)


def finish(proc, what, timeout=120):
    output = getattr(proc, "output", None) or Output(proc)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"{what}: ddprun did not finish within {timeout} s\n"
                             f"{output.text()}")
    out = output.text()
    if proc.returncode != 0:
        raise AssertionError(f"{what}: ddprun exited {proc.returncode}\n{out}")
    digests = DIGEST.findall(out)
    if not digests:
        raise AssertionError(f"{what}: no final parameter line\n{out}")
    return out, digests[-1]


def check_snapshots(workdir, what):
    for path in glob.glob(os.path.join(workdir, "snapshot*.pt")):
        problem = verify_snapshot(path)
        if problem:
            raise AssertionError(f"{what}: unreadable snapshot left behind: {problem}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--toy", required=True)
    ap.add_argument("--slow-write", required=True,
                    help="tests/support/slow_snapshot_write.c built as a shared library")
    ap.add_argument("--kills", type=int, default=20)
    ap.add_argument("--seed", type=int, default=None)
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"fault test seed {seed} (rerun with --seed {seed})", flush=True)
    root = tempfile.mkdtemp(prefix="ddp_fault_")
    try:
        # The uninterrupted reference.
        ref_dir = os.path.join(root, "ref")
        os.makedirs(ref_dir)
        t0 = time.monotonic()
        _, reference = finish(start(args, ref_dir), "reference run")
        duration = time.monotonic() - t0
        check_snapshots(ref_dir, "reference run")
        print(f"reference: parameters {reference}, {duration:.2f} s", flush=True)

        resumed = 0
        for i in range(args.kills):
            workdir = os.path.join(root, f"kill{i}")
            os.makedirs(workdir)
            proc = start(args, workdir)
            proc.output = Output(proc)
            # A random moment of training: after rank 0 announced a random epoch, plus up to
            # one epoch's time (a few runs die before any snapshot, most after some).
            epoch = rng.randrange(0, EPOCHS)
            proc.output.wait_for(f"[RANK0] Epoch {epoch} |")
            time.sleep(rng.uniform(0.0, 0.05))
            workers = children(proc.pid)
            victim = rng.choice(workers) if workers else None
            if victim:
                os.kill(victim, signal.SIGKILL)
            out, digest = finish(proc, f"kill {i}")
            if digest != reference:
                raise AssertionError(f"kill {i}: final parameters {digest} differ from the "
                                     f"uninterrupted run's {reference}\n{out}")
            check_snapshots(workdir, f"kill {i}")
            resumed += "Resuming training from snapshot" in out
            print(f"kill {i} (in epoch {epoch}): "
                  f"{'killed ' + str(victim) if victim else 'no worker yet'}; "
                  f"{'resumed' if 'Resuming' in out else 'restarted from scratch'}; "
                  f"parameters equal", flush=True)
            shutil.rmtree(workdir)

        # Rank 0 killed while its snapshot file is half written (the --slow-write LD_PRELOAD
        # shim pauses there), at each of the first three snapshots.
        for n in range(3):
            workdir = os.path.join(root, f"write{n}")
            os.makedirs(workdir)
            proc = start(args, workdir, {"LD_PRELOAD": args.slow_write,
                                         "SLOW_SNAPSHOT_WRITE_DELAY_MS": "200"})
            killed = None
            deadline = time.monotonic() + 60
            seen = 0
            while killed is None and proc.poll() is None and time.monotonic() < deadline:
                tmps = glob.glob(os.path.join(workdir, ".snapshot.epoch-*.tmp-*"))
                if tmps:
                    seen += 1
                    if seen > n:  # skip n writes, kill during write n
                        # .NAME.tmp-<pid>-<random hex>: the writer's pid (snapshot_file.hpp).
                        pid = int(re.search(r"\.tmp-(\d+)-", tmps[0]).group(1))
                        os.kill(pid, signal.SIGKILL)
                        killed = pid
                    else:
                        while glob.glob(os.path.join(workdir, ".snapshot.epoch-*.tmp-*")):
                            time.sleep(0.005)
                time.sleep(0.005)
            if killed is None:
                raise AssertionError(f"write kill {n}: never saw a snapshot being written")
            out, digest = finish(proc, f"write kill {n}")
            if digest != reference:
                raise AssertionError(f"write kill {n}: parameters {digest} != {reference}\n{out}")
            check_snapshots(workdir, f"write kill {n}")
            print(f"write kill {n}: rank 0 (pid {killed}) killed mid-write; parameters equal",
                  flush=True)
            shutil.rmtree(workdir)
        print(f"OK: {args.kills} random kills ({resumed} resumed from a snapshot) and 3 "
              f"mid-write kills, all finished with the reference parameters")
        return 0
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
