#!/usr/bin/env python3
"""PyTorch 2.13's side of bench/checkpoint/run.sh: the same loop and state as
bench_checkpoint.cpp, saved with torch.distributed.checkpoint.save (sync) or async_save (at most
one in flight: the previous future is waited for before the next save, as PyTorch's docs
recommend). One JSON line with the same keys.

    bench_dcp.py --state 1gb|cnn --mode async|sync --dir DIR [--saves 3] [--every 25]
"""
import argparse
import json
import shutil
import statistics
import time
import warnings

import torch
import torch.distributed.checkpoint as dcp

warnings.filterwarnings("ignore")


class Cnn(torch.nn.Module):
    """The tutorial's CNN (ddp::models::MnistCnn): the same parameter count."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3)
        self.conv2 = torch.nn.Conv2d(32, 64, 3)
        self.fc1 = torch.nn.Linear(9216, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x):
        x = torch.max_pool2d(torch.relu(self.conv2(torch.relu(self.conv1(x)))), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def step_work(a):
    with torch.no_grad():
        x = a
        for _ in range(8):
            x = torch.tanh(torch.mm(x, a))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--state", choices=["1gb", "cnn"], default="1gb")
    ap.add_argument("--mode", choices=["async", "sync"], default="async")
    ap.add_argument("--dir", required=True)
    ap.add_argument("--saves", type=int, default=3)
    ap.add_argument("--every", type=int, default=25)
    args = ap.parse_args()

    if args.state == "1gb":
        state = {"model": {f"w{i}": torch.full((4096, 4096), 0.5 + i) for i in range(16)}}
        nbytes = sum(t.nbytes for t in state["model"].values())
    else:
        model = Cnn()
        opt = torch.optim.Adam(model.parameters())
        model(torch.randn(8, 1, 28, 28)).sum().backward()
        opt.step()
        state = {"model": model.state_dict(), "optim": opt.state_dict()}
        nbytes = 3 * sum(p.nbytes for p in model.parameters())

    work = torch.randn(1024, 1024) / 32
    steps = args.saves * args.every
    t0 = time.perf_counter()
    for _ in range(steps):
        step_work(work)
    baseline = time.perf_counter() - t0

    shutil.rmtree(args.dir, ignore_errors=True)
    stalls, pending = [], None
    t0 = time.perf_counter()
    for s in range(1, steps + 1):
        step_work(work)
        if s % args.every == 0:
            t = time.perf_counter()
            path = f"{args.dir}/step-{s:08d}"
            if args.mode == "async":
                if pending is not None:
                    pending.result()
                pending = dcp.async_save(state, checkpoint_id=path)
            else:
                dcp.save(state, checkpoint_id=path)
            stalls.append(time.perf_counter() - t)
    if pending is not None:
        pending.result()
    job = time.perf_counter() - t0
    shutil.rmtree(args.dir, ignore_errors=True)
    print(json.dumps({"bench": "checkpoint", "impl": "pytorch-dcp", "mode": args.mode,
                      "state": args.state, "state_bytes": nbytes, "saves": args.saves,
                      "stall_s_median": round(statistics.median(stalls), 4),
                      "stall_s_first": round(stalls[0], 4), "job_s": round(job, 3),
                      "baseline_job_s": round(baseline, 3),
                      "slowdown": round(job / baseline - 1, 4)}), flush=True)


if __name__ == "__main__":
    main()
