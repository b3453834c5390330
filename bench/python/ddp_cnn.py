#!/usr/bin/env python3
"""PyTorch's DistributedDataParallel on the tutorials' CNN (Fashion-MNIST, batch 64 per rank,
Adam 1e-3, one intra-op thread per rank) on one backend, one process per rank under ddprun.
The model, data and step are bench/ddp/bench_ddp.py's. Rank 0 prints one JSON object.

    ddprun --standalone --nproc-per-node 2 .venv/bin/python ddp_cnn.py ddp [STEPS] [WARMUP]
"""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "ddp"))
import ddp  # noqa: E402,F401  (registers the "ddp" backend)
from bench_ddp import BATCH, Cnn, load_data  # noqa: E402


def main():
    backend = sys.argv[1]
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 60
    warmup = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    torch.set_num_threads(1)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    images, labels, source = load_data()
    images, labels = images[rank::world].contiguous(), labels[rank::world].contiguous()
    batches = images.shape[0] // BATCH
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(Cnn())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    def step(i):
        b = i % batches
        opt.zero_grad()
        loss = F.nll_loss(model(images[b * BATCH:(b + 1) * BATCH]),
                          labels[b * BATCH:(b + 1) * BATCH])
        loss.backward()
        opt.step()

    for i in range(warmup):
        step(i)
    dist.barrier()
    begin = time.perf_counter()
    for i in range(steps):
        step(warmup + i)
    elapsed = torch.tensor([time.perf_counter() - begin], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    if rank == 0:
        seconds = elapsed.item()
        print(json.dumps({"bench": "ddp_cnn", "impl": "pytorch", "backend": backend,
                          "data": source, "world": world, "batch_per_rank": BATCH,
                          "steps": steps, "seconds": round(seconds, 3),
                          "samples_per_s": round(world * BATCH * steps / seconds, 1)}),
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
