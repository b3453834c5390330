"""What ddp.StepManager costs a failure-free training step, measured in the same processes.

bench/fault/overhead.sh compares whole runs (plain DDP, then StepManager, in alternating pairs);
on this project's 2-core machine their medians swing by several percent from run to run, more
than the cost it looks for. This script times both in the same processes instead, in
alternating blocks, so a drift of the machine's load hits both alike: the same CNN
(bench/ddp/bench_ddp.py's `Cnn`, batch 64 per rank, Adam, one thread per rank), one model under
plain PyTorch DDP (its own comm hook, `zero_grad()`), the other under `ddp.StepManager` (its
bucket layout, comm hook, generator snapshots and membership checks), on PyTorch's gloo or the
ddp backend, under ddprun's step recovery:

    PYTHONPATH=build/python ddprun --standalone --nproc-per-node 3 --recovery step \\
        --no-python PYTHON bench/fault/step_cost.py [--backend gloo|ddp] [--blocks 6] [--steps 60]

Prints one JSON line (rank 0): `bench` "step_manager_cost", `backend`, `world`,
`step_ms_plain`, `step_ms_step_manager` (medians of rank 0's step wall times, the first 5 of
each block left out), `overhead_pct` (StepManager over plain, minus 1), `cpu_ms_plain`,
`cpu_ms_step_manager`, `cpu_overhead_pct` (the same for rank 0's CPU time per step),
`block_overheads_pct` (each block pair's ratio of medians, to show the spread), `blocks`,
`steps_per_block`, `load1_before`, `load1_after`, `target_under_2pct`.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ddp"))
from bench_ddp import BATCH, Cnn  # noqa: E402

import ddp  # noqa: E402

WARMUP = 5


def timed_block(step, steps):
    """Wall and CPU seconds of each of `steps` calls of step(), the first WARMUP left out."""
    wall, cpu = [], []
    for i in range(steps):
        w, c = time.perf_counter(), time.process_time()
        step()
        if i >= WARMUP:
            wall.append(time.perf_counter() - w)
            cpu.append(time.process_time() - c)
    return wall, cpu


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="gloo", choices=["gloo", "ddp"])
    ap.add_argument("--blocks", type=int, default=6)
    ap.add_argument("--steps", type=int, default=60)
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    dist.init_process_group(args.backend)
    torch.set_num_threads(1)
    torch.manual_seed(dist.get_rank())
    x, y = torch.randn(BATCH, 1, 28, 28), torch.randint(0, 10, (BATCH,))

    plain = DistributedDataParallel(Cnn())
    plain_opt = torch.optim.Adam(plain.parameters(), lr=1e-3)
    managed = DistributedDataParallel(Cnn(), init_sync=False)
    managed_opt = torch.optim.Adam(managed.parameters(), lr=1e-3)
    steps = ddp.StepManager(managed, managed_opt)

    def plain_step():
        plain_opt.zero_grad()
        F.nll_loss(plain(x), y).backward()
        plain_opt.step()

    def managed_step():
        steps.run_step(lambda: F.nll_loss(managed(x), y))

    times = {"plain": ([], []), "step_manager": ([], [])}
    block_ratios = []
    for _ in range(args.blocks):
        medians = {}
        for name, step in (("plain", plain_step), ("step_manager", managed_step)):
            wall, cpu = timed_block(step, args.steps)
            times[name][0].extend(wall)
            times[name][1].extend(cpu)
            medians[name] = statistics.median(wall)
        block_ratios.append(medians["step_manager"] / medians["plain"])
    if dist.get_rank() == 0:
        ms = {name: (statistics.median(w) * 1e3, statistics.median(c) * 1e3)
              for name, (w, c) in times.items()}
        overhead = (ms["step_manager"][0] / ms["plain"][0] - 1) * 100
        print(json.dumps({
            "bench": "step_manager_cost", "backend": args.backend, "world": dist.get_world_size(),
            "step_ms_plain": round(ms["plain"][0], 2),
            "step_ms_step_manager": round(ms["step_manager"][0], 2),
            "overhead_pct": round(overhead, 2),
            "cpu_ms_plain": round(ms["plain"][1], 2),
            "cpu_ms_step_manager": round(ms["step_manager"][1], 2),
            "cpu_overhead_pct": round((ms["step_manager"][1] / ms["plain"][1] - 1) * 100, 2),
            "block_overheads_pct": [round((r - 1) * 100, 1) for r in block_ratios],
            "blocks": args.blocks, "steps_per_block": args.steps - WARMUP,
            "load1_before": round(load_before, 2), "load1_after": round(os.getloadavg()[0], 2),
            "target_under_2pct": overhead < 2.0}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
