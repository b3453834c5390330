"""Error messages of the ddp backend: bad tensors, unsupported operations, mismatched
collectives (DDP_DEBUG_COLLECTIVES=1) and timeouts naming the ranks that never arrived. Each
error is a RuntimeError; the interpreter survives it.
Run: ddprun --standalone --nproc-per-node N .venv/bin/python errors.py usage|mismatch"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

from common import expect_error, init

mode = sys.argv[1]
if mode == "mismatch":
    os.environ["DDP_DEBUG_COLLECTIVES"] = "1"
rank, n = init("ddp", timeout_s=60)
store = dist.distributed_c10d._get_default_store()
R = dist.ReduceOp

if mode == "usage":
    # A meta tensor never reaches a backend in torch 2.x: torch's own meta kernels of the c10d
    # ops serve it (shape propagation, no data, gloo alike). The call must not raise or
    # communicate, and the group stays usable (checked below).
    meta = torch.empty(4, device="meta")
    dist.all_gather_into_tensor(torch.empty(4 * n, device="meta"), meta)
    expect_error("int16 all_reduce", lambda: dist.all_reduce(torch.zeros(2, dtype=torch.int16)),
                 "backend ddp does not support dtype int16 in all_reduce")
    expect_error("BAND on float", lambda: dist.all_reduce(torch.zeros(2), op=R.BAND),
                 "backend ddp does not support ReduceOp.BAND on float32 tensors")
    expect_error("BOR in reduce", lambda: dist.reduce(torch.zeros(2, dtype=torch.int32), 0,
                                                      op=R.BOR),
                 "backend ddp does not support ReduceOp.BOR in reduce")
    expect_error("sparse", lambda: dist.all_reduce(torch.zeros(2).to_sparse()),
                 "backend ddp does not support")
    expect_error("all_gather wrong slot", lambda: dist.all_gather(
        [torch.zeros(3) for _ in range(n)], torch.zeros(2)), "all_gather: output[")
    expect_error("uneven all_to_all_single", lambda: dist.all_to_all_single(
        torch.zeros(n + 1), torch.zeros(n + 1)), "does not split evenly")
    # The group still works after those (they were refused before anything was sent).
    t = torch.ones(3)
    dist.all_reduce(t)
    assert torch.equal(t, torch.full((3,), float(n))), t

    # ddp.StepManager outside `ddprun --recovery step` (this test's ddprun has none): refused
    # with the fix, before it touches the model.
    import ddp
    from torch.nn.parallel import DistributedDataParallel
    model = DistributedDataParallel(torch.nn.Linear(2, 2), init_sync=False)
    expect_error("StepManager without --recovery step",
                 lambda: ddp.StepManager(model, torch.optim.SGD(model.parameters(), lr=0.1)),
                 "ddp.StepManager needs 'ddprun --recovery step'")

    # Timeout: the last rank never joins this all_reduce; the others are told who is missing,
    # from wait() and from the future alike. A group of its own with a short timeout (the
    # default group keeps a long one so that joining survives a loaded machine).
    short = dist.new_group(backend="ddp", timeout=datetime.timedelta(seconds=6))
    if rank == n - 1:
        store.wait(["ddp_test/verdict"])  # stay alive until the others checked
        store.set("ddp_test/ack", "1")  # rank 0 hosts the store: it leaves after this
        os._exit(0)
    t0 = time.time()
    msg = expect_error("timeout", lambda: dist.all_reduce(torch.ones(10), group=short),
                       f"waiting for ranks [{n - 1}]", "timed out after 6000 ms")
    elapsed = time.time() - t0
    assert elapsed < 30, f"timeout took {elapsed:.1f} s"
    expect_error("after the failure",
                 lambda: dist.all_reduce(torch.ones(1 << 20), group=short,
                                         async_op=True).get_future().wait(),
                 "unusable after an earlier failure")
    if rank == 0:
        print("timeout message:", msg.splitlines()[0], flush=True)
        store.set("ddp_test/verdict", "done")
        store.wait(["ddp_test/ack"])
        print("errors usage: ok", flush=True)
    os._exit(0)

if mode == "mismatch":
    # Rank 0 all_reduces 10 elements, the others 20: the fingerprint check names both calls.
    count = 10 if rank == 0 else 20
    msg = expect_error("mismatch", lambda: dist.all_reduce(torch.ones(count)),
                       "collective mismatch", "rank 0 called all_reduce(float32, count=10, sum)",
                       "called all_reduce(float32, count=20, sum)")
    store.set(f"ddp_test/checked/{rank}", "1")
    if rank == 0:  # hosts the store: leaves only once every rank read its message
        store.wait([f"ddp_test/checked/{r}" for r in range(n)])
        print("mismatch message:", msg.splitlines()[0], flush=True)
        print("errors mismatch: ok", flush=True)
    os._exit(0)
