"""Helpers shared by the Python tests of the ddp backend (each test is a script run by
ddprun, one process per rank; a failed check raises, the rank exits non-zero)."""
import datetime

import torch
import torch.distributed as dist

import ddp  # noqa: F401  (registers the backend)

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32,
          torch.int64, torch.uint8]


def init(backend="ddp", timeout_s=60, **kw):
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kw)
    torch.set_num_threads(1)
    return dist.get_rank(), dist.get_world_size()


def check_equal(name, got, want):
    if isinstance(got, torch.Tensor):
        ok = got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    else:
        ok = got == want
    if not ok:
        raise AssertionError(f"rank {dist.get_rank()}: {name}: got {got!r}, want {want!r}")


def expect_error(name, fn, *fragments):
    """fn() must raise RuntimeError whose message holds every fragment."""
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        missing = [f for f in fragments if f not in msg]
        if missing:
            raise AssertionError(f"{name}: message lacks {missing}: {msg}")
        return msg
    raise AssertionError(f"{name}: no error raised")


def done(name):
    dist.barrier()
    if dist.get_rank() == 0:
        print(f"{name}: ok (world {dist.get_world_size()})", flush=True)
    dist.destroy_process_group()  # joins the groups' threads: teardown is part of the test
