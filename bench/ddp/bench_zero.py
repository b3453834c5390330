#!/usr/bin/env python3
"""PyTorch reference for bench_zero: torch.distributed.optim.ZeroRedundancyOptimizer over
torch.optim.Adam (lr 1e-3), `layers` weight matrices of width x width with biases and fixed
gradients, one intra-op thread per rank, gloo, W processes. Only step() is timed (the local
step and the parameter broadcasts). Prints one JSON line, the same fields as bench_zero.

unsharded_adam_step_ms: a plain torch.optim.Adam's median step over the same parameters in the
main process (one thread, no communication), for scale.

Usage: .venv/bin/python bench_zero.py --world 2 [--layers 8] [--width 512] [--steps 20]

state_bytes_max_rank counts the tensors in the largest rank's zero.optim.state (PyTorch 1.13
keeps Adam's step as a one-element tensor: 4 bytes per parameter tensor more than LibTorch).
"""
import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.optim import ZeroRedundancyOptimizer


def make_params(layers, width):
    torch.manual_seed(0)
    params = []
    for _ in range(layers):
        for shape in ((width, width), (width,)):
            p = torch.nn.Parameter(torch.randn(shape).mul_(0.05))
            p.grad = torch.randn(shape).mul_(0.01)
            params.append(p)
    return params


def state_bytes(optim):
    return sum(t.numel() * t.element_size() for s in optim.state.values()
               for t in s.values() if torch.is_tensor(t))


def worker(rank, args, store_path, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store_path, rank=rank,
                            world_size=args.world)
    zero = ZeroRedundancyOptimizer(make_params(args.layers, args.width), torch.optim.Adam, lr=1e-3)
    times = []
    for s in range(args.steps + 3):
        t0 = time.perf_counter()
        zero.step()
        if s >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
    with open(out + str(rank), "w") as f:
        json.dump({"times": times, "bytes": state_bytes(zero.optim)}, f)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--width", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out")
        mp.start_processes(worker, args=(args, os.path.join(d, "store"), out),
                           nprocs=args.world, start_method="fork")
        ranks = [json.load(open(out + str(r))) for r in range(args.world)]
    per_step = [max(r["times"][s] for r in ranks) for s in range(args.steps)]
    params = make_params(args.layers, args.width)
    torch.set_num_threads(1)
    adam = torch.optim.Adam(params, lr=1e-3)
    adam_times = []
    for s in range(args.steps + 3):
        t0 = time.perf_counter()
        adam.step()
        if s >= 3:
            adam_times.append((time.perf_counter() - t0) * 1e3)
    unsharded = state_bytes(adam)
    biggest = max(r["bytes"] for r in ranks)
    print(json.dumps({"bench": "zero", "impl": "pytorch", "optimizer": "adam", "world": args.world,
                      "params": sum(p.numel() for p in params), "steps": args.steps,
                      "step_ms": statistics.median(per_step),
                      "unsharded_adam_step_ms": statistics.median(adam_times), "state_bytes_max_rank": biggest,
                      "unsharded_state_bytes": unsharded,
                      "state_fraction": biggest / unsharded}))


if __name__ == "__main__":
    main()
