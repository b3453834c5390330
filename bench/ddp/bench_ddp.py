#!/usr/bin/env python3
"""PyTorch DDP reference for bench_ddp: the same CNN on Fashion-MNIST, Adam 1e-3, batch 64 per
rank, one intra-op thread per rank, gloo, W processes. Prints one JSON line (rank 0).

Usage: .venv/bin/python bench_ddp.py --world 2 [--steps 60] [--warmup 5]
                                     [--gradient-as-bucket-view] [--comm-hook powersgd]
                                     [--single-bucket]

--comm-hook powersgd registers powerSGD_hook (matrix_approximation_rank 1, start_powerSGD_iter
2, as bench_ddp's). --single-bucket puts every gradient in one bucket (both caps 1 GiB): with
several buckets powerSGD_hook aborts on gloo here (its future callbacks issue the P and Q
all-reduces of different buckets in different orders on different ranks).

With MALLOC_TRIM_THRESHOLD_ in the environment (glibc then keeps freed memory mapped, as
ddp::keep_freed_memory() does for the C++ bench) the line says impl "pytorch_malloc_tuned".
"""
import argparse
import gzip
import json
import os
import socket
import struct
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

BATCH = 64
DATA_DIR = "/usr/share/datasets/fashion-mnist"


class Cnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = torch.flatten(F.max_pool2d(x, 2), 1)
        x = F.relu(self.fc1(x))
        return F.log_softmax(self.fc2(x), dim=1)


def read_idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    ndim = raw[3]
    dims = struct.unpack(">" + "I" * ndim, raw[4:4 + 4 * ndim])
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def load_data():
    try:
        images = read_idx(os.path.join(DATA_DIR, "train-images-idx3-ubyte.gz"))
        labels = read_idx(os.path.join(DATA_DIR, "train-labels-idx1-ubyte.gz"))
        x = (torch.from_numpy(images.astype(np.float32) / 255.0) - 0.1307) / 0.3081
        return x.unsqueeze(1), torch.from_numpy(labels.astype(np.int64)), "fashion-mnist"
    except OSError:
        return torch.randn(60000, 1, 28, 28), torch.randint(0, 10, (60000,)), "random"


def worker(rank, world, port, steps, warmup, bucket_view, comm_hook, single_bucket):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    images, labels, source = load_data()
    images, labels = images[rank::world].contiguous(), labels[rank::world].contiguous()
    batches = images.shape[0] // BATCH
    torch.manual_seed(0)
    if single_bucket:
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30  # read by DDP's constructor
    model = nn.parallel.DistributedDataParallel(Cnn(), gradient_as_bucket_view=bucket_view,
                                                bucket_cap_mb=1024 if single_bucket else 25)
    if comm_hook == "powersgd":
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as ps
        state = ps.PowerSGDState(process_group=None, matrix_approximation_rank=1,
                                 start_powerSGD_iter=2)
        model.register_comm_hook(state, ps.powerSGD_hook)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_sum = 0.0

    def step(i):
        nonlocal loss_sum
        b = i % batches
        opt.zero_grad()
        loss = F.nll_loss(model(images[b * BATCH:(b + 1) * BATCH]),
                          labels[b * BATCH:(b + 1) * BATCH])
        loss.backward()
        opt.step()
        loss_sum += loss.item()

    for i in range(warmup):
        step(i)
    dist.barrier()
    begin = time.perf_counter()
    cpu_begin = time.process_time()  # all threads of this process, like the C++ bench
    for i in range(steps):
        step(warmup + i)
    elapsed = torch.tensor([time.perf_counter() - begin], dtype=torch.float64)
    cpu_ms = torch.tensor([1e3 * (time.process_time() - cpu_begin) / steps], dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    dist.all_reduce(cpu_ms, op=dist.ReduceOp.MAX)
    if rank == 0:
        seconds = elapsed.item()
        tuned = "MALLOC_TRIM_THRESHOLD_" in os.environ
        print(json.dumps({"bench": "ddp_cnn",
                          "impl": "pytorch_malloc_tuned" if tuned else "pytorch",
                          "gradient_as_bucket_view": bucket_view,
                          "comm_hook": comm_hook, "single_bucket": single_bucket,
                          "malloc_tuned": tuned, "data": source,
                          "world": world, "batch_per_rank": BATCH, "threads_per_rank": 1,
                          "optimizer": "adam 1e-3", "steps": steps, "seconds": seconds,
                          "cpu_ms_per_step_max_rank": cpu_ms.item(),
                          "samples_per_s": world * BATCH * steps / seconds,
                          "mean_loss": loss_sum / (steps + warmup),
                          "torch": torch.__version__}), flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--gradient-as-bucket-view", action="store_true",
                        help="DDP's gradient_as_bucket_view=True (no gradient copies)")
    parser.add_argument("--comm-hook", choices=["allreduce", "powersgd"], default="allreduce")
    parser.add_argument("--single-bucket", action="store_true")
    args = parser.parse_args()
    with socket.socket() as s:  # port chosen by binding port 0
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, nprocs=args.world,
             args=(args.world, port, args.steps, args.warmup, args.gradient_as_bucket_view,
                   args.comm_hook, args.single_bucket))


if __name__ == "__main__":
    main()
