"""Per-call barrier timeouts on the ddp backend: the group's monitored_barrier(timeout) (as
PyTorch's own suite calls it: dist.monitored_barrier itself accepts gloo only) and
barrier(timeout=...) end after their own limit, naming the ranks that did not arrive, while the
group's timeout is far longer (gloo behaves so; ddp once waited for the group's timeout).
Run: ddprun --standalone --nproc-per-node N python3 barrier_timeout.py   (N >= 2)"""
import datetime
import time

import torch
import torch.distributed as dist

from common import check_equal, done, expect_error, init

GROUP_TIMEOUT_S = 300  # what the per-call limits must not wait for
LIMIT = datetime.timedelta(seconds=2)
rank, n = init(timeout_s=GROUP_TIMEOUT_S)
late = list(range(1, n))  # every rank but 0 arrives late


def resync(what):
    t = torch.ones(1)
    dist.all_reduce(t)  # the group still works afterwards
    check_equal(f"all_reduce after {what}", t, torch.full((1,), float(n)))


world = dist.distributed_c10d._get_default_group()

# Everyone arrives: passes.
world.monitored_barrier(datetime.timedelta(seconds=60))
dist.barrier(timeout=datetime.timedelta(seconds=60))

for what, call, names in [
    ("monitored_barrier", lambda: world.monitored_barrier(LIMIT), late[:1]),
    ("monitored_barrier wait_all_ranks",
     lambda: world.monitored_barrier(LIMIT, wait_all_ranks=True), late),
    ("barrier(timeout)", lambda: dist.barrier(timeout=LIMIT), late[:1]),
]:
    if rank == 0:
        start = time.monotonic()
        listed = ", ".join(map(str, names))
        word = "rank" if len(names) == 1 else "ranks"
        expect_error(what, call, f"{word} {listed} failed to pass the barrier within 2000 ms")
        waited = time.monotonic() - start
        # The per-call limit, not the group's 300 s (a generous bound: a loaded machine).
        if waited > GROUP_TIMEOUT_S / 5:
            raise AssertionError(f"{what}: waited {waited:.0f} s, the limit is 2 s")
    else:
        time.sleep(6)  # absent for longer than rank 0's limit
    resync(what)

done("barrier_timeout")
