#!/usr/bin/env python3
"""Runs one training job of bench/fault and, optionally, kills one worker at a given step, the
same way for every system: the job's rank 0 appends "<step> <loss>" to a log after each
committed step; the driver polls that file every 2 ms and, when step K first appears, sends
SIGKILL to the victim, the first incarnation of the worker process whose environment holds
VICTIM (e.g. RANK=1) and this run's FAULT_BENCH_TAG (so no other job's process can match).
The kill therefore lands in step K+1 of the victim, within about 2 ms of rank 0 committing K.

Prints one JSON object (see bench/fault/README.md for the keys):

  fault_driver.py --system NAME --log LOSS_LOG [--kill-at K --victim RANK=1] \
      [--timeout S] [--out OUTPUT_FILE] -- COMMAND...
"""
import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import uuid


def environ_of(pid):
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    return dict(kv.split("=", 1) for kv in raw.decode(errors="replace").split("\0") if "=" in kv)


def ppid_of(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def find_victim(tag, key, value):
    """The first-incarnation worker (LOCAL_RANK set by the launcher, restart count 0) of this
    run whose environment has key=value; the topmost one when its children inherit it."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        env = environ_of(int(d))
        if (env and env.get("FAULT_BENCH_TAG") == tag and env.get(key) == value
                and "LOCAL_RANK" in env and env.get("TORCHELASTIC_RESTART_COUNT") == "0"):
            found.append(int(d))
    top = [p for p in found if ppid_of(p) not in found]
    return min(top) if top else None


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--system", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--kill-at", type=int, default=0)
    p.add_argument("--victim", default="RANK=1")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--out", default=os.devnull)
    p.add_argument("--steps-per-epoch", type=int, default=0,
                   help="renumber a log that restarts at step 1 after a snapshot resume "
                        "(examples/mnist --snapshot: 'Resuming from ... at epoch E')")
    p.add_argument("cmd", nargs=argparse.REMAINDER)
    a = p.parse_args()
    cmd = a.cmd[1:] if a.cmd and a.cmd[0] == "--" else a.cmd
    key, value = a.victim.split("=", 1)
    tag = uuid.uuid4().hex
    env = dict(os.environ, FAULT_BENCH_TAG=tag)
    if os.path.exists(a.log):
        os.remove(a.log)

    lines = []  # (step, time since start)
    cpus = []  # rank 0's CPU seconds at each of lines, where the log gives them
    buf = b""
    pos = 0
    victim = None
    t_kill = None
    load_before = os.getloadavg()[0]
    out = open(a.out, "wb")
    start = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                            start_new_session=True)
    timed_out = False
    while True:
        rc = proc.poll()
        now = time.monotonic() - start
        try:
            with open(a.log, "rb") as f:
                f.seek(pos)
                chunk = f.read()
        except OSError:
            chunk = b""
        if chunk:
            pos += len(chunk)
            buf += chunk
            *complete, buf = buf.split(b"\n")
            for line in complete:
                if line.strip():
                    fields = line.split()
                    lines.append((int(fields[0]), now))
                    cpus.append(float(fields[2]) if len(fields) > 2 else None)
        if a.kill_at > 0 and t_kill is None:
            if victim is None and lines:
                victim = find_victim(tag, key, value)
            if victim is not None and any(s == a.kill_at for s, _ in lines[-64:]):
                os.kill(victim, signal.SIGKILL)
                t_kill = time.monotonic() - start
        if rc is not None:
            break
        if now > a.timeout:
            os.killpg(proc.pid, signal.SIGKILL)
            timed_out = True
            proc.wait()
            break
        time.sleep(0.002)
    wall = time.monotonic() - start
    rc = proc.returncode
    out.close()

    text = open(a.out, errors="replace").read() if a.out != os.devnull else ""
    resumed = re.search(r"Resuming from .* at epoch (\d+)", text)
    if a.steps_per_epoch and resumed and t_kill is not None:
        offset, prev, renumbered, reset = (int(resumed.group(1)) - 1) * a.steps_per_epoch, 0, [], False
        for s, t in lines:
            reset = reset or (t > t_kill and s == 1 and prev > 1)
            renumbered.append((s + offset if reset else s, t))
            prev = s
        lines = renumbered
    steps = [s for s, _ in lines]
    logged_twice = len(steps) - len(set(steps))
    res = {"bench": "fault", "system": a.system, "kill_at_step": a.kill_at or None,
           "exit_code": rc, "timed_out": timed_out, "wall_s": round(wall, 3),
           "steps_logged": len(steps), "last_step": max(steps) if steps else None,
           "steps_logged_twice": logged_twice, "load1_before": round(load_before, 2),
           "load1_after": round(os.getloadavg()[0], 2)}
    before = [t for _, t in lines if t_kill is None or t <= t_kill]
    gaps = [b - a_ for a_, b in zip(before[10:], before[11:])]
    step_s = statistics.median(gaps) if gaps else None
    res["step_s_median"] = round(step_s, 4) if step_s else None
    # The same window in rank 0's CPU seconds per step (logs that give them: fault_train.py).
    window = cpus[10:len(before)]
    cpu_gaps = [b - a_ for a_, b in zip(window, window[1:]) if a_ is not None and b is not None]
    res["cpu_s_per_step_median"] = round(statistics.median(cpu_gaps), 5) if cpu_gaps else None
    if a.kill_at > 0:
        res["killed_pid"] = victim
        res["kill_t_s"] = round(t_kill, 3) if t_kill is not None else None
        if t_kill is not None:
            # Back at the kill point: rank 0 commits step K+1 (after the kill) for the first time.
            back = [t for s, t in lines if t > t_kill and s == a.kill_at + 1]
            res["back_at_kill_point_s"] = round(back[0] - t_kill, 3) if back else None
            res["stall_s"] = (round(back[0] - t_kill - step_s, 3)
                              if back and step_s else None)
            # The same against the steps right after the kill point, not before it: the redone
            # step ran at the size the job had then (under --recovery shrink the survivors
            # split the lost rank's share, so each of their steps is longer).
            after = sorted(t for s, t in lines if t > t_kill and a.kill_at + 1 <= s <= a.kill_at + 4)
            after_gaps = [b - a_ for a_, b in zip(after, after[1:])]
            res["stall_at_size_s"] = (round(back[0] - t_kill - statistics.median(after_gaps), 3)
                                      if back and after_gaps else None)
            res["steps_after_kill"] = sum(1 for _, t in lines if t > t_kill)
    m = re.search(r"(\d+) attempts dropped on rank 0|attempts dropped: (\d+)", text)
    res["attempts_dropped_rank0"] = int(m.group(1) or m.group(2)) if m else None
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
