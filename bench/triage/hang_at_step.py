#!/usr/bin/env python3
"""A PyTorch job on gloo that hangs at a known moment: every rank all-reduces WARM times, then
rank 1 records the time in HANG_MARK (a file) and sleeps in its own function while the others
wait in the next all_reduce. Unmodified PyTorch: it runs under ddprun and under torchrun alike.

    LAUNCHER ... hang_at_step.py HANG_MARK [WARM]
"""
import sys
import time

import torch
import torch.distributed as dist


def load_next_shard():
    time.sleep(3600)  # where rank 1 hangs; a useful report names this line


def main():
    mark = sys.argv[1]
    warm = int(sys.argv[2]) if len(sys.argv) > 2 else 20
    dist.init_process_group("gloo")
    t = torch.ones(1024)
    for _ in range(warm):
        dist.all_reduce(t)
    if dist.get_rank() == 1:
        with open(mark, "w") as f:
            f.write(repr(time.time()))
        load_next_shard()
    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
