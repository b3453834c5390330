#!/usr/bin/env python3
"""torch.distributed all_reduce (float32, sum) from Python on one backend; run one process per
rank under ddprun (or torchrun). Rank 0 prints one JSON object per size, in allreduce_bench's
format, with backend "torch-<backend>". The timing loop is bench/allreduce/torch_allreduce.py's,
so these figures compare one to one with that script's gloo yardstick.

    ddprun --standalone --nproc-per-node 2 .venv/bin/python allreduce.py ddp [SIZES]
"""
import os
import sys

import torch
import torch.distributed as dist

import ddp  # noqa: F401  (registers the "ddp" backend)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "allreduce"))
from torch_allreduce import measure_allreduce  # noqa: E402


def main():
    backend = sys.argv[1]
    sizes = [int(s) for s in sys.argv[2].split(",")] if len(sys.argv) > 2 else \
        [4096, 1 << 20, 16 << 20, 64 << 20]
    torch.set_num_threads(1)
    dist.init_process_group(backend)
    # gloo is slow at small sizes: cap its iterations so the run stays short.
    measure_allreduce("torch-" + backend, sizes, max_iters=1000 if backend == "gloo" else 5000)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
