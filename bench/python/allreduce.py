#!/usr/bin/python3
"""torch.distributed all_reduce (float32, sum) from Python on one backend; run one process per
rank under ddprun (or torchrun). Rank 0 prints one JSON object per size, in allreduce_bench's
format, with backend "torch-<backend>".

    ddprun --standalone --nproc-per-node 2 /usr/bin/python3 allreduce.py ddp [SIZES]
"""
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist

import ddp  # noqa: F401  (registers the "ddp" backend)


def iterations_for(nbytes):
    return min(5000, max(10, (256 << 20) // max(nbytes, 1)))


def main():
    backend = sys.argv[1]
    sizes = [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else \
        [4096, 1 << 20, 16 << 20, 64 << 20]
    torch.set_num_threads(1)
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    for nbytes in sizes:
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        iters = iterations_for(nbytes)
        if backend == "gloo":
            iters = min(iters, 1000)  # gloo is slow at small sizes: keep the run short
        for _ in range(min(iters, 20)):
            dist.all_reduce(t)
        dist.barrier()
        results = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(t)
            results.append((time.perf_counter() - t0) / iters * 1e6)
        us = statistics.median(results)
        if rank == 0:
            busbw = nbytes * 2.0 * (world - 1) / world / (us * 1e-6) / 1e9
            print(json.dumps({"bench": "allreduce", "backend": "torch-" + backend,
                              "world": world, "bytes": nbytes, "iters": iters,
                              "us": round(us, 2), "busbw_gbps": round(busbw, 3)}), flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
