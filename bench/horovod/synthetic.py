"""Horovod's synthetic PyTorch benchmark pattern: a fixed model, synthetic data, images/s.

    ddprun --standalone --nproc-per-node 2 synthetic.py --impl hvd        # ddp's Horovod layer
    ddprun --standalone --nproc-per-node 2 synthetic.py --impl torch-ddp  # PyTorch DDP on gloo

--impl hvd: `import horovod.torch as hvd` (whichever the PYTHONPATH gives: ddp's layer, or a
real Horovod), hvd.DistributedOptimizer, parameters broadcast from rank 0 — the steps of
Horovod's examples/pytorch/pytorch_synthetic_benchmark.py. --impl torch-ddp: the same model,
data and optimizer under torch.nn.parallel.DistributedDataParallel on gloo. The model is a
small ResNet-style CNN defined here (the index has no CPU torchvision). Rank 0 prints one JSON
line: the implementation, backend, ranks, images/s per rank (median over --num-iters
measurements of --num-batches-per-iter steps each) and the total.
"""

import argparse
import json
import os
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.skip = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                   nn.BatchNorm2d(cout)) if stride != 1 or cin != cout else None)

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.skip is None else self.skip(x)))


class SmallResNet(nn.Module):
    """About 2.8 M parameters on 64x64 images, 100 classes."""

    def __init__(self, classes=100):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32),
                                  nn.ReLU())
        self.layers = nn.Sequential(Block(32, 64, 2), Block(64, 128, 2), Block(128, 256, 2),
                                    Block(256, 256, 2))
        self.fc = nn.Linear(256, classes)

    def forward(self, x):
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--impl", choices=["hvd", "torch-ddp"], required=True)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--num-warmup-batches", type=int, default=3)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--fp16-allreduce", action="store_true")
    a = p.parse_args()

    torch.manual_seed(0)
    model = SmallResNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    if a.impl == "hvd":
        import horovod.torch as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        compression = hvd.Compression.fp16 if a.fp16_allreduce else hvd.Compression.none
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                             compression=compression)
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        where = getattr(hvd, "__file__", "")
        backend = "horovod" if "ddp" not in where else os.environ.get("HOROVOD_DDP_BACKEND",
                                                                        "ddp")
        impl = "ddp-horovod-layer" if "ddp" in where else "horovod-" + getattr(
            __import__("horovod"), "__version__", "?")
    else:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank, size = dist.get_rank(), dist.get_world_size()
        model = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        backend, impl = "gloo", "torch-ddp"

    data = torch.randn(a.batch_size, 3, a.image_size, a.image_size)
    target = torch.randint(0, 100, (a.batch_size,))

    def step():
        optimizer.zero_grad()
        F.cross_entropy(model(data), target).backward()
        optimizer.step()

    for _ in range(a.num_warmup_batches):
        step()
    rates = []
    for _ in range(a.num_iters):
        t0 = time.perf_counter()
        for _ in range(a.num_batches_per_iter):
            step()
        rates.append(a.batch_size * a.num_batches_per_iter / (time.perf_counter() - t0))
    if rank == 0:
        per_rank = statistics.median(rates)
        print(json.dumps({"bench": "horovod_synthetic", "impl": impl, "backend": backend,
                          "ranks": size, "batch_size": a.batch_size,
                          "image_size": a.image_size, "fp16_allreduce": a.fp16_allreduce,
                          "img_per_s_per_rank": round(per_rank, 2),
                          "img_per_s_total": round(per_rank * size, 2),
                          "img_per_s_per_rank_all": [round(r, 2) for r in rates],
                          "loadavg_1m": os.getloadavg()[0]}), flush=True)


if __name__ == "__main__":
    main()
