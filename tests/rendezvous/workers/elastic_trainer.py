"""A toy elastic trainer for the multi-node rendezvous tests (PyTorch gloo, env:// init).

Uses only the worker environment contract (RANK, WORLD_SIZE, MASTER_ADDR/PORT,
TORCHELASTIC_RESTART_COUNT). Every step all-reduces a tensor of ones and checks the sum equals
WORLD_SIZE; rank 0 saves the step reached to a snapshot file (atomically), and a restarted
worker group resumes from it (rank 0 reads it and broadcasts it).

    elastic_trainer.py SNAPSHOT STEPS [--step-s S] [--until-world W] [--until-file F]

With --until-world / --until-file the group keeps stepping past STEPS until it runs with at
least W workers and file F exists (rank 0 looks and the step's all-reduce carries its answer,
so every rank stops at the same step); a test can then grow and shrink the job while it
trains without racing it. It gives up after 120 s. Prints one line per start and "done".
"""
import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    p = argparse.ArgumentParser()
    p.add_argument("snapshot")
    p.add_argument("steps", type=int)
    p.add_argument("--step-s", type=float, default=0.05)
    p.add_argument("--until-world", type=int, default=0)
    p.add_argument("--until-file", default="")
    a = p.parse_args()

    restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    assert rank == int(os.environ["RANK"]) and world == int(os.environ["WORLD_SIZE"])

    start = torch.zeros(1, dtype=torch.int64)
    if rank == 0 and os.path.exists(a.snapshot):
        with open(a.snapshot) as f:
            start[0] = json.load(f)["step"]
    dist.broadcast(start, 0)
    step = int(start[0])
    print(f"worker RANK={rank} WORLD_SIZE={world} GROUP_RANK={os.environ['GROUP_RANK']} "
          f"LOCAL_RANK={os.environ['LOCAL_RANK']} RESTART={restart} start_step={step}",
          flush=True)

    deadline = time.monotonic() + 120
    file_seen = not a.until_file
    while step < a.steps or world < a.until_world or not file_seen:
        if time.monotonic() > deadline:
            print(f"rank {rank}: gave up waiting for world {a.until_world} / file "
                  f"{a.until_file}", file=sys.stderr, flush=True)
            sys.exit(3)
        t = torch.ones(5)
        t[4] = 1 if rank == 0 and a.until_file and os.path.exists(a.until_file) else 0
        dist.all_reduce(t)
        file_seen = file_seen or int(t[4]) > 0
        if int(t[0]) != world:
            print(f"rank {rank}: all_reduce gave {t[0]}, expected {world}", file=sys.stderr)
            sys.exit(4)
        step += 1
        if rank == 0:
            tmp = a.snapshot + ".tmp"
            with open(tmp, "w") as f:
                json.dump({"step": step, "world": world}, f)
            os.replace(tmp, a.snapshot)
        time.sleep(a.step_s)
    dist.barrier()
    print(f"done RANK={rank} WORLD_SIZE={world} step={step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
