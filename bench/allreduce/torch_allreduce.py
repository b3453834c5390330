"""PyTorch's gloo all_reduce at the same sizes, as the yardstick for allreduce_bench.

Run with the .venv's interpreter (PyTorch 2.13; bench/python.sh). Spawns `world` processes itself and prints
one JSON object per line from rank 0, in allreduce_bench's format (backend "torch-gloo").

    torch_allreduce.py [world] [sizes]
    torch_allreduce.py env [sizes] [budget_ms]   one rank, from RANK, WORLD_SIZE, MASTER_ADDR,
                                                 MASTER_PORT (bench/allreduce/hosts.sh; set
                                                 GLOO_SOCKET_IFNAME to the link's interface)

With a budget (slow links), 2 warm-up calls instead of half the timed ones, and rank 0 picks the iterations so
that the 3 timed loops take about budget_ms in all (allreduce_bench's --budget-ms).
"""
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def iterations_for(nbytes):
    return min(5000, max(10, (256 << 20) // max(nbytes, 1)))


def measure_allreduce(label, sizes, max_iters=5000, budget_ms=0):
    """Times float32 sum all_reduces on the initialised default group; rank 0 prints one JSON
    line per size in allreduce_bench's format with backend `label` (p50_us and p99_us over
    every timed call). Also used by bench/python/allreduce.py for the "ddp" torch.distributed
    backend."""
    rank, world = dist.get_rank(), dist.get_world_size()
    for nbytes in sizes:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        iters = min(iterations_for(nbytes), max_iters)
        if budget_ms > 0:
            dist.all_reduce(t)
            dist.barrier()
            t0 = time.perf_counter()
            dist.all_reduce(t)
            one_ms = (time.perf_counter() - t0) * 1e3
            chosen = torch.tensor([max(1, min(iters, int(budget_ms / 3 / one_ms)))])
            dist.broadcast(chosen, 0)  # every rank loops as often as rank 0 says
            iters = int(chosen.item())
        else:
            for _ in range(max(min(iters, 20), iters // 2)):  # allreduce_bench's warm-up
                dist.all_reduce(t)
        dist.barrier()
        results, calls = [], []
        for _ in range(3):
            t0 = prev = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
                now = time.perf_counter()
                calls.append((now - prev) * 1e6)
                prev = now
            results.append((prev - t0) / iters * 1e6)
        us = statistics.median(results)
        calls.sort()
        if rank == 0:
            busbw = nbytes * 2.0 * (world - 1) / world / (us * 1e-6) / 1e9
            print(json.dumps({"bench": "allreduce", "backend": label, "world": world,
                              "bytes": nbytes, "iters": iters, "us": round(us, 2),
                              "p50_us": round(calls[len(calls) // 2], 2),
                              "p99_us": round(calls[min(len(calls) - 1,
                                                        int(0.99 * len(calls)))], 2),
                              "busbw_gbps": round(busbw, 3)}), flush=True)
        dist.barrier()


def worker(rank, world, port, sizes):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    # PyTorch's gloo is slow at small sizes: cap its iterations so the run stays short.
    measure_allreduce("torch-gloo", sizes, max_iters=1000)
    dist.destroy_process_group()


def env_rank(sizes, budget_ms):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))
    measure_allreduce("torch-gloo", sizes, max_iters=1000, budget_ms=budget_ms)
    dist.destroy_process_group()


def main():
    sizes = [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else \
        [4096, 1 << 20, 16 << 20, 64 << 20]
    if len(sys.argv) > 1 and sys.argv[1] == "env":
        env_rank(sizes, float(sys.argv[3]) if len(sys.argv) > 3 else 0)
        return
    world = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, args=(world, port, sizes), nprocs=world, join=True)


if __name__ == "__main__":
    main()
