"""A hang on the ddp backend from Python: every rank all-reduces 20 times, the last rank stops
after collective #5 and sleeps. The others time out after 3 s; their process groups write
flight recorder records (so does the sleeping rank, through its watcher), and ddprun prints a
hang report naming the last rank (ctest checks ddprun's output for it).
Run: ddprun --standalone --nproc-per-node N /usr/bin/python3 hang.py"""
import time

import torch
import torch.distributed as dist

from common import init

rank, n = init("ddp", timeout_s=3)
t = torch.ones(64)
for i in range(1, 21):
    if rank == n - 1 and i == 6:
        time.sleep(60)  # ddprun stops this rank after the others failed
    dist.all_reduce(t)
