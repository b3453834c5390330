"""Object collectives, sub-groups, async work and futures, and the init methods, on the ddp
backend. Run: ddprun --standalone --nproc-per-node N /usr/bin/python3 groups_async.py [INIT]
INIT: env (default), tcp, file:PATH, store (an explicit TCPStore, rank= and world_size=)."""
import datetime
import os
import sys

import time

import torch
import torch.distributed as dist

from common import check_equal, done, init

mode = sys.argv[1] if len(sys.argv) > 1 else "env"
if mode == "env":
    rank, n = init("ddp")
elif mode == "tcp":
    rank, n = init("ddp", init_method="tcp://{}:{}".format(os.environ["MASTER_ADDR"],
                                                           os.environ["MASTER_PORT"]),
                   rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
elif mode.startswith("file:"):
    rank, n = init("ddp", init_method="file://" + mode[5:], rank=int(os.environ["RANK"]),
                   world_size=int(os.environ["WORLD_SIZE"]))
elif mode == "store":
    r, w = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), w, r == 0,
                          timeout=datetime.timedelta(seconds=60))
    rank, n = init("ddp", store=store, rank=r, world_size=w)
else:
    raise SystemExit("unknown init mode " + mode)
check_equal("backend", dist.get_backend(), "ddp")

# Object collectives (pickled through byte tensors).
objs = [None] * n
dist.all_gather_object(objs, {"rank": rank, "s": "x" * (rank * 100)})
check_equal("all_gather_object", objs, [{"rank": r, "s": "x" * (r * 100)} for r in range(n)])
lst = [f"hello {rank}", rank] if rank == 0 else [None, None]
dist.broadcast_object_list(lst, src=0)
check_equal("broadcast_object_list", lst, ["hello 0", 0])
out = [None] * n if rank == 0 else None
dist.gather_object(("g", rank), out, dst=0)
if rank == 0:
    check_equal("gather_object", out, [("g", r) for r in range(n)])
got = [None]
dist.scatter_object_list(got, [{"to": r} for r in range(n)] if rank == 0 else None, src=0)
check_equal("scatter_object_list", got[0], {"to": rank})

# Async work: wait, is_completed, futures with callbacks, small (inline) and large ops.
for numel in (16, 1 << 20):
    t = torch.full((numel,), float(rank + 1))
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future().then(lambda f: f.value()[0] * 2)
    doubled = fut.wait()
    check_equal(f"future.then {numel}", doubled, torch.full((numel,), float(n * (n + 1))))
    check_equal(f"is_completed {numel}", work.is_completed(), True)
    work.wait()
    check_equal(f"async all_reduce {numel}", t, torch.full((numel,), n * (n + 1) / 2))
works = [dist.all_reduce(torch.ones(50000) * i, async_op=True) for i in range(8)]
futs = torch.futures.collect_all([w.get_future() for w in works]).wait()
for i, f in enumerate(futs):
    check_equal(f"collect_all {i}", f.value()[0], torch.full((50000,), float(i * n)))
# A callback that waits for a later future (both large enough to complete asynchronously):
# the later one must not wait behind the thread running the callback (it once deadlocked).
a, c = torch.ones(1 << 16), torch.ones(1 << 16) * 2
f1 = dist.all_reduce(a, async_op=True).get_future()
f2 = dist.all_reduce(c, async_op=True).get_future()
got = f1.then(lambda _: f2.wait()[0].sum().item()).wait()
check_equal("callback waits for a later future", got, float(2 * n * (1 << 16)))
# A future's callback that issues a collective while this thread issues the next one (as
# PowerSGD's hook does per bucket): every rank must issue them in the same order, whatever the
# timing. Rank 0 issues `nxt` while `big` is still in flight; the other ranks only after `big`
# finished and its callback issued `inner`. Issued in arrival order, rank 0 would reduce `nxt`
# (5 elements) against the others' `inner` (3 elements) and fail. Rank 0's callback is slow
# (3 s, as on a loaded machine): the completer must not give up on it and issue `nxt` first (it
# did after 2 s, and the CI machine's load once made that happen).
def reduce_inner(_):
    if rank == 0:
        time.sleep(3)
    inner = torch.full((3,), float(rank))
    dist.all_reduce(inner)
    return inner


big = torch.ones(1 << 20)
f_inner = dist.all_reduce(big, async_op=True).get_future().then(reduce_inner)
if rank != 0:
    f_inner.wait()
nxt = torch.full((5,), float(rank + 1))
w_nxt = dist.all_reduce(nxt, async_op=True)
check_equal("collective issued by a callback", f_inner.wait(), torch.full((3,), float(sum(range(n)))))
w_nxt.wait()
check_equal("collective issued after it", nxt, torch.full((5,), n * (n + 1) / 2))
b = dist.barrier(async_op=True)
b.wait()
check_equal("barrier future", b.get_future().wait(), [])

# Sub-groups: every rank calls new_group; non-members get NON_GROUP_MEMBER.
evens = dist.new_group(ranks=list(range(0, n, 2)), backend="ddp")
if rank % 2 == 0:
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=evens)
    check_equal("sub-group all_reduce", t, torch.tensor([float(sum(range(0, n, 2)))]))
    t = torch.tensor([float(rank)])
    dist.broadcast(t, src=max(range(0, n, 2)), group=evens)
    check_equal("sub-group broadcast", t, torch.tensor([float(max(range(0, n, 2)))]))
    check_equal("sub-group size", dist.get_world_size(evens), len(range(0, n, 2)))
if n >= 2:
    last2 = dist.new_group(ranks=[n - 2, n - 1])
    if rank >= n - 2:
        objs = [None, None]
        dist.all_gather_object(objs, rank, group=last2)
        check_equal("sub-group all_gather_object", objs, [n - 2, n - 1])
        t = torch.zeros(1)
        if rank == n - 1:
            dist.send(torch.tensor([42.0]), dst=n - 2, group=last2)
        else:
            dist.recv(t, src=n - 1, group=last2)
            check_equal("sub-group send/recv (global ranks)", t, torch.tensor([42.0]))
world_again = dist.new_group(backend="ddp")
t = torch.ones(3)
dist.all_reduce(t, group=world_again)
check_equal("second world group", t, torch.full((3,), float(n)))
done(f"groups_async ({mode})")
