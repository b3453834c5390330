# An unmodified PyTorch DDP-style script: env:// init over gloo, one all_reduce, check.
# Run by the launcher tests under ddprun with 2 workers.
import os
import sys

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    world = dist.get_world_size()
    assert rank == int(os.environ["RANK"]), (rank, os.environ["RANK"])
    assert world == int(os.environ["WORLD_SIZE"])
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    expected = world * (world + 1) / 2
    if not torch.allclose(t, torch.full((4,), expected)):
        print(f"rank {rank}: all_reduce gave {t.tolist()}, expected {expected}", file=sys.stderr)
        sys.exit(1)
    print(f"rank {rank}/{world}: all_reduce ok {t[0].item()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
