"""Every torch.distributed operation on the ddp backend, every dtype, against expected
values. Run: ddprun --standalone --nproc-per-node N /usr/bin/python3 collectives.py [--hosts]"""
import math
import os
import sys

import torch
import torch.distributed as dist

from common import DTYPES, check_equal, done, expect_error, init

if "--hosts" in sys.argv:
    # Simulated hosts (rank % 2): the hierarchical path, shared memory within a host and Gloo
    # between hosts.
    os.environ["DDP_HOST_ID"] = "host{}".format(int(os.environ["RANK"]) % 2)
rank, n = init()
R = dist.ReduceOp


def full(shape, v, dtype):
    return torch.full(shape, v, dtype=torch.float64).to(dtype)


def is_float(dtype):
    return dtype.is_floating_point


for dt in DTYPES:
    tag = str(dt).replace("torch.", "")
    vals = [r + 1 for r in range(n)]
    # all_reduce with every ReduceOp that applies; non-contiguous and 2-D tensors too.
    for op, want in [(R.SUM, sum(vals)), (R.MIN, 1), (R.MAX, n), (R.PRODUCT, math.prod(vals)),
                     (R.AVG, sum(vals) / n if is_float(dt) else sum(vals) // n)]:
        t = full((3, 5), rank + 1, dt)
        dist.all_reduce(t, op=op)
        check_equal(f"all_reduce {op} {tag}", t, full((3, 5), want, dt))
        t = full((5, 3), rank + 1, dt).t()
        dist.all_reduce(t, op=op)
        check_equal(f"all_reduce non-contiguous {op} {tag}", t, full((3, 5), want, dt))
    big = full((70000,), rank + 1, dt)  # above the inline limit: runs on the worker thread
    dist.all_reduce(big)
    check_equal(f"all_reduce large {tag}", big, full((70000,), sum(vals), dt))
    if not is_float(dt):
        for op, fn in [(R.BAND, lambda a, b: a & b), (R.BOR, lambda a, b: a | b),
                       (R.BXOR, lambda a, b: a ^ b)]:
            t = torch.tensor([rank + 1, 3 * rank + 5, 255 - rank], dtype=dt)
            want = torch.tensor([1, 5, 255], dtype=dt)
            for r in range(1, n):
                want = fn(want, torch.tensor([r + 1, 3 * r + 5, 255 - r], dtype=dt))
            dist.all_reduce(t, op=op)
            check_equal(f"all_reduce {op} {tag}", t, want)
    a, b = full((4,), rank, dt), full((2, 3), 2 * rank, dt)
    dist.all_reduce_coalesced([a, b])
    s = sum(range(n))
    check_equal(f"all_reduce_coalesced {tag}", a, full((4,), s, dt))
    check_equal(f"all_reduce_coalesced {tag} [1]", b, full((2, 3), 2 * s, dt))

    # broadcast from every root
    for root in range(n):
        t = full((2, 3), rank + 10, dt)
        dist.broadcast(t, src=root)
        check_equal(f"broadcast root {root} {tag}", t, full((2, 3), root + 10, dt))

    # reduce to the last rank
    t = full((6,), rank + 1, dt)
    dist.reduce(t, dst=n - 1, op=R.SUM)
    if rank == n - 1:
        check_equal(f"reduce {tag}", t, full((6,), sum(vals), dt))

    # all_gather (list and into one tensor), gather
    mine = full((2, 2), rank, dt)
    outs = [torch.zeros(2, 2, dtype=dt) for _ in range(n)]
    dist.all_gather(outs, mine)
    for r in range(n):
        check_equal(f"all_gather {tag} [{r}]", outs[r], full((2, 2), r, dt))
    out = torch.zeros(2 * n, 2, dtype=dt)
    dist.all_gather_into_tensor(out, mine)
    check_equal(f"all_gather_into_tensor {tag}",
                out, torch.cat([full((2, 2), r, dt) for r in range(n)]))
    gl = [torch.zeros(2, 2, dtype=dt) for _ in range(n)] if rank == 0 else None
    dist.gather(mine, gl, dst=0)
    if rank == 0:
        for r in range(n):
            check_equal(f"gather {tag} [{r}]", gl[r], full((2, 2), r, dt))

    # scatter
    t = torch.zeros(3, dtype=dt)
    sl = [full((3,), 7 + r, dt) for r in range(n)] if rank == 1 % n else None
    dist.scatter(t, sl, src=1 % n)
    check_equal(f"scatter {tag}", t, full((3,), 7 + rank, dt))

    # reduce_scatter (list and tensor forms)
    t = torch.zeros(3, dtype=dt)
    dist.reduce_scatter(t, [full((3,), rank + r, dt) for r in range(n)])
    check_equal(f"reduce_scatter {tag}", t, full((3,), sum(x + rank for x in range(n)), dt))
    src = torch.cat([full((2,), rank + r, dt) for r in range(n)])
    t = torch.zeros(2, dtype=dt)
    dist.reduce_scatter_tensor(t, src)
    check_equal(f"reduce_scatter_tensor {tag}", t, full((2,), sum(x + rank for x in range(n)), dt))

    # all_to_all (list form, even and uneven) and all_to_all_single (even and uneven splits)
    ins = [full((2,), 10 * rank + p, dt) for p in range(n)]
    outs = [torch.zeros(2, dtype=dt) for _ in range(n)]
    dist.all_to_all(outs, ins)
    for p in range(n):
        check_equal(f"all_to_all {tag} [{p}]", outs[p], full((2,), 10 * p + rank, dt))
    ins = [full((p + 1,), 10 * rank + p, dt) for p in range(n)]
    outs = [torch.zeros(rank + 1, dtype=dt) for _ in range(n)]
    dist.all_to_all(outs, ins)
    for p in range(n):
        check_equal(f"all_to_all uneven {tag} [{p}]", outs[p], full((rank + 1,), 10 * p + rank, dt))
    src = torch.cat([full((2, 3), 10 * rank + p, dt) for p in range(n)])
    out = torch.zeros(2 * n, 3, dtype=dt)
    dist.all_to_all_single(out, src)
    check_equal(f"all_to_all_single {tag}", out,
                torch.cat([full((2, 3), 10 * p + rank, dt) for p in range(n)]))
    in_splits = [p + 1 for p in range(n)]            # rank sends p+1 rows to p
    out_splits = [rank + 1] * n                      # and receives rank+1 rows from each
    src = torch.cat([full((p + 1, 2), 10 * rank + p, dt) for p in range(n)])
    out = torch.zeros(sum(out_splits), 2, dtype=dt)
    dist.all_to_all_single(out, src, out_splits, in_splits)
    check_equal(f"all_to_all_single uneven {tag}", out,
                torch.cat([full((rank + 1, 2), 10 * p + rank, dt) for p in range(n)]))

    # Mixed: rank 0's own splits are even (1 row to and from everyone), every other rank's are
    # not (1 row to rank 0, 2 to each other rank). Valid for PyTorch (gloo completes it); a
    # backend choosing its algorithm from the local splits alone would hang here.
    def rows(i, j):
        return 1 if i == 0 or j == 0 else 2
    in_splits = [rows(rank, p) for p in range(n)]
    out_splits = [rows(p, rank) for p in range(n)]
    src = torch.cat([full((rows(rank, p),), 100 * rank + p, dt) for p in range(n)])
    out = torch.zeros(sum(out_splits), dtype=dt)
    dist.all_to_all_single(out, src, out_splits, in_splits)
    check_equal(f"all_to_all_single mixed even/uneven {tag}", out,
                torch.cat([full((rows(p, rank),), 100 * p + rank, dt) for p in range(n)]))
    ins = [full((rows(rank, p),), 100 * rank + p, dt) for p in range(n)]
    outs = [torch.zeros(rows(p, rank), dtype=dt) for p in range(n)]
    dist.all_to_all(outs, ins)
    for p in range(n):
        check_equal(f"all_to_all mixed even/uneven {tag} [{p}]", outs[p],
                    full((rows(p, rank),), 100 * p + rank, dt))

    # send / recv around a ring, blocking and non-blocking
    right, left = (rank + 1) % n, (rank - 1) % n
    t = torch.zeros(4, dtype=dt)
    reqs = [dist.irecv(t, src=left, tag=3), dist.isend(full((4,), rank, dt), dst=right, tag=3)]
    for q in reqs:
        q.wait()
    check_equal(f"isend/irecv {tag}", t, full((4,), left, dt))
    if rank % 2 == 0:
        dist.send(full((5,), rank + 1, dt), dst=right)
        t = torch.zeros(5, dtype=dt)
        dist.recv(t, src=left)
    else:
        t = torch.zeros(5, dtype=dt)
        dist.recv(t, src=left)
        dist.send(full((5,), rank + 1, dt), dst=right)
    check_equal(f"send/recv {tag}", t, full((5,), left + 1, dt))
    if rank == 0:
        print(f"{tag}: ok", flush=True)

# recv from any source (src=None): rank 0 takes one message from every other rank in arrival
# order, learns the sender from recv's return value (irecv: the Work's _source_rank()). Within
# one host through shared memory; across (simulated) hosts through Gloo's multi-source receive.
if rank == 0:
    seen = []
    for k in range(1, n):
        t = torch.zeros(6)
        if k % 2:
            src = dist.recv(t, tag=11)
        else:
            w = dist.irecv(t, tag=11)
            w.wait()
            src = w._source_rank()
        check_equal(f"recv from any source {k}", t, torch.full((6,), float(src * 10)))
        seen.append(src)
    check_equal("recv from any source: every sender once", sorted(seen), list(range(1, n)))
else:
    dist.send(torch.full((6,), float(rank * 10)), dst=0, tag=11)

# dtypes ddp does not reduce still move: bool, int8, int16, complex64 (all_reduce SUM on complex
# goes through torch's view_as_real).
for dt in [torch.bool, torch.int8, torch.int16, torch.complex64]:
    t = torch.tensor([rank, 1, 0], dtype=torch.int64).to(dt)
    dist.broadcast(t, src=0)
    check_equal(f"broadcast {dt}", t, torch.tensor([0, 1, 0]).to(dt))
    outs = [torch.zeros(3, dtype=dt) for _ in range(n)]
    dist.all_gather(outs, torch.tensor([rank % 2, 1, 0]).to(dt))
    for r in range(n):
        check_equal(f"all_gather {dt}", outs[r], torch.tensor([r % 2, 1, 0]).to(dt))
c = torch.tensor([1 + 2j, rank * 1j], dtype=torch.complex64)
dist.all_reduce(c)
check_equal("all_reduce complex64", c,
            torch.tensor([n + 2j * n, sum(range(n)) * 1j], dtype=torch.complex64))
b = torch.tensor([rank == 0, True, False])
dist.all_reduce(b, op=R.MAX)
check_equal("all_reduce bool MAX", b, torch.tensor([True, True, False]))
b = torch.tensor([rank == 0, True, False])
dist.all_reduce(b, op=R.BAND)
check_equal("all_reduce bool BAND", b, torch.tensor([n == 1, True, False]))
# batch_isend_irecv around the ring, all_gather_coalesced
t = torch.zeros(3)
reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((3,), float(rank)), (rank + 1) % n),
                               dist.P2POp(dist.irecv, t, (rank - 1) % n)])
for q in reqs:
    q.wait()
check_equal("batch_isend_irecv", t, torch.full((3,), float((rank - 1) % n)))
outs = [[torch.zeros(2), torch.zeros(3, 1)] for _ in range(n)]
dist.all_gather_coalesced(outs, [torch.full((2,), float(rank)), torch.full((3, 1), -rank * 1.0)])
for r in range(n):
    check_equal(f"all_gather_coalesced [{r}][0]", outs[r][0], torch.full((2,), float(r)))
    check_equal(f"all_gather_coalesced [{r}][1]", outs[r][1], torch.full((3, 1), -r * 1.0))
dist.barrier()
z = torch.zeros(0)
dist.all_reduce(z)
check_equal("all_reduce empty", z, torch.zeros(0))
done("collectives")
