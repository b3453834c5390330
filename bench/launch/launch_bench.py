#!/usr/bin/env python3
"""Wall time to launch and reap 2 no-op workers: ddprun beside torchrun, in the same run.

    .venv/bin/python bench/launch/launch_bench.py [--ddprun PATH] [--reps 50] [--torchrun-reps 3]

Prints one JSON object per line: one per launcher with the median (and min, max) wall time
in milliseconds, then the ratio torchrun/ddprun. Each timing covers starting the launcher
process until it has exited (so it includes Python's own fork/exec of the launcher, about a
millisecond, for both tools alike).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def find_ddprun(given):
    candidates = [given] if given else []
    candidates.append(os.environ.get("DDPRUN", ""))
    for build in ("build", "build-launcher"):
        candidates.append(os.path.join(ROOT, build, "apps", "ddprun", "ddprun"))
    for c in candidates:
        if c and os.access(c, os.X_OK):
            return c
    sys.exit("launch_bench: ddprun not found; build it (cmake --build build --target ddprun) "
             "or pass --ddprun PATH")


def time_runs(cmd, reps, env):
    times_ms = []
    for _ in range(reps):
        start = time.perf_counter()
        proc = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              timeout=120)
        elapsed = (time.perf_counter() - start) * 1000.0
        if proc.returncode != 0:
            sys.exit(f"launch_bench: {' '.join(cmd)} exited {proc.returncode}:\n"
                     f"{proc.stderr.decode(errors='replace')}")
        times_ms.append(elapsed)
    return times_ms


def summary(tool, times_ms):
    return {"bench": "launch", "tool": tool, "workers": 2, "reps": len(times_ms),
            "median_ms": round(statistics.median(times_ms), 3),
            "min_ms": round(min(times_ms), 3), "max_ms": round(max(times_ms), 3)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ddprun", help="path of the ddprun binary")
    parser.add_argument("--reps", type=int, default=50, help="ddprun repetitions")
    parser.add_argument("--torchrun-reps", type=int, default=3,
                        help="torchrun repetitions (about 7 s each); 0 skips torchrun")
    args = parser.parse_args()

    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    for key in list(env):
        if key.startswith("PET_"):
            del env[key]

    ddprun = find_ddprun(args.ddprun)
    ddprun_cmd = [ddprun, "--standalone", "--nproc-per-node", "2", "--no-python", "/bin/true"]
    time_runs(ddprun_cmd, 3, env)  # warm the page cache
    ddprun_ms = time_runs(ddprun_cmd, args.reps, env)
    d = summary("ddprun", ddprun_ms)
    d["target_ms"] = 50
    print(json.dumps(d), flush=True)

    if args.torchrun_reps <= 0:
        return
    if subprocess.run([sys.executable, "-c", "import torch.distributed.run"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        print(json.dumps({"bench": "launch", "tool": "torchrun",
                          "skipped": sys.executable + " cannot import torch.distributed.run"}))
        return
    log_dir = tempfile.mkdtemp(prefix="launch_bench_torchrun_")
    try:
        # torchrun under Python 3.11 fails with the default --redirects 0 (DESIGN.md).
        torchrun_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "2", "--redirects", "1", "--tee", "1", "--log-dir",
                        log_dir, "--no-python", "/bin/true"]
        # torchrun 1.13 spells flags with underscores only.
        torchrun_cmd = [a.replace("--nproc-per-node", "--nproc_per_node")
                        .replace("--log-dir", "--log_dir").replace("--no-python", "--no_python")
                        for a in torchrun_cmd]
        torchrun_ms = time_runs(torchrun_cmd, args.torchrun_reps, env)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)
    t = summary("torchrun", torchrun_ms)
    print(json.dumps(t), flush=True)
    print(json.dumps({"bench": "launch", "compare": "torchrun/ddprun", "workers": 2,
                      "ratio": round(t["median_ms"] / d["median_ms"], 1)}), flush=True)


if __name__ == "__main__":
    main()
