"""Horovod's collectives (horovod.torch.mpi_ops) on torch.distributed.

Every collective negotiates first (negotiation.py: one small all-reduce that checks the ranks
agree and serves ranks that called join()), then issues its data operation asynchronously and
returns a handle; the blocking forms synchronize at once. Semantics follow Horovod 0.28.1:
Average divides by the full size (joined ranks count, with zeros), allgather and alltoall take
a different first dimension per rank, reducescatter gives the first (rows % size) ranks one row
more. Results are new tensors except for the trailing-underscore (in-place) forms.
"""

import warnings

import torch
import torch.distributed as dist

from ..common.exceptions import HorovodInternalError
from . import adasum as _adasum
from . import handles as _handles
from . import negotiation as _neg
from . import runtime as _rt
from .compression import Compression

# Horovod's reduction constants (horovod.common.basics).
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OP_NAMES = {Average: "Average", Sum: "Sum", Adasum: "Adasum", Min: "Min", Max: "Max",
             Product: "Product"}
_TORCH_OPS = {Average: dist.ReduceOp.SUM, Sum: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN,
              Max: dist.ReduceOp.MAX, Product: dist.ReduceOp.PRODUCT}


class ProcessSet:
    """Only the global process set exists in this layer."""

    process_set_id = 0

    def size(self):
        return _rt.size()

    def rank(self):
        return _rt.rank()

    def included(self):
        return True


global_process_set = ProcessSet()


def _global_only(process_set):
    if process_set is not None and process_set is not global_process_set:
        raise NotImplementedError("ddp's Horovod layer has only the global process set; "
                                  "use torch.distributed.new_group for subgroups")


def add_process_set(process_set):
    raise NotImplementedError("hvd.add_process_set: ddp's Horovod layer has only the global "
                              "process set")


def remove_process_set(process_set):
    raise NotImplementedError("hvd.remove_process_set: ddp's Horovod layer has only the "
                              "global process set")


def _resolve_op(average, op, default=Average):
    if average is not None:
        if op is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of "
                             "them.")
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed",
                      DeprecationWarning)
        return Average if average else Sum
    return default if op is None else op


def _negotiate(kind, tensor, count, name, op=0, root=0):
    """Blocks until every active rank has submitted its header; raises on a disagreement."""
    header = _neg.active_header(kind, tensor.dtype, count, op, root)
    try:
        dist.all_reduce(header, op=dist.ReduceOp.MAX)
    except RuntimeError as e:
        raise HorovodInternalError(f"{_neg.KIND_NAMES[kind]} {name or ''}: {e}") from e
    outcome = _neg.Outcome(header)
    fields = [_neg.KIND, _neg.DTYPE, _neg.OP, _neg.ROOT, _neg.COUNT]
    problem = outcome.mismatch(fields)
    if problem:
        raise HorovodInternalError(f"Mismatched {_neg.KIND_NAMES[kind]} {name or ''}: {problem}")
    if outcome.someone_joined() and kind != _neg.ALLREDUCE:
        raise HorovodInternalError(f"{_neg.KIND_NAMES[kind]} is not supported once a rank has "
                                   "called hvd.join() (Horovod allows only allreduce then)")


def _scale_(t, factor):
    if factor == 1.0:
        return t
    if t.dtype.is_floating_point or t.dtype.is_complex:
        return t.mul_(factor)
    return t.copy_((t.double() * factor).to(t.dtype))  # integers: truncated, as Horovod


def _trailing(t):
    return t[0].numel() if t.dim() > 0 and t.shape[0] > 0 else max(1, t.numel())


# ----- allreduce -----

def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor):
    if op not in _OP_NAMES:
        raise ValueError(f"hvd.allreduce: op={op!r} is not one of Average, Sum, Adasum, Min, "
                         "Max, Product")
    in_place = output is tensor
    buf = tensor.detach()
    copied = not in_place or not buf.is_contiguous()
    if copied:
        buf = buf.clone(memory_format=torch.contiguous_format)
    if op == Adasum:
        return _adasum_async(tensor, buf, in_place, copied, name, prescale_factor,
                             postscale_factor)
    _negotiate(_neg.ALLREDUCE, buf, buf.numel(), name, op)
    _scale_(buf, prescale_factor)
    work = dist.all_reduce(buf, op=_TORCH_OPS[op], async_op=True)
    post = postscale_factor / (_rt.size() if op == Average else 1)

    def finish():
        _scale_(buf, post)
        return _result(tensor, buf, in_place, copied)

    return _handles.register(_handles.Pending([work], finish))


def _result(tensor, buf, in_place, copied):
    """The user's tensor (updated) for the in-place forms, else the buffer."""
    if not in_place:
        return buf
    if copied:
        tensor.detach().copy_(buf)
    return tensor


def _adasum_async(tensor, buf, in_place, copied, name, prescale_factor, postscale_factor):
    n = _rt.size()
    if not _adasum.is_power_of_two(n):
        raise NotImplementedError("Running Adasum with non-power of 2 ranks is not supported "
                                  f"yet ({n} ranks).")
    _negotiate(_neg.ADASUM, buf, buf.numel(), name, Adasum)
    flat = _scale_(buf.reshape(-1), prescale_factor)
    parts = [torch.empty_like(flat) for _ in range(n)]
    dist.all_gather(parts, flat)
    flat.copy_(_adasum.tree(parts))
    _scale_(flat, postscale_factor)
    return _handles.register(_handles.Pending(
        [], lambda: _result(tensor, buf, in_place, copied)))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set):
    _global_only(process_set)
    op = _resolve_op(average, op)
    return _allreduce_async(tensor, None, name, op, prescale_factor, postscale_factor)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set):
    _global_only(process_set)
    op = _resolve_op(average, op)
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set):
    return _handles.synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                                 postscale_factor, process_set))


class _AllreduceFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale_factor, postscale_factor):
        ctx.args = (op, prescale_factor, postscale_factor)
        return _handles.synchronize(
            _allreduce_async(tensor, None, name, op, prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, grad):
        op, pre, post = ctx.args
        return (_AllreduceFn.apply(grad.contiguous(), None, op, pre, post), None, None, None,
                None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    """A new tensor: the reduction of `tensor` over all ranks (differentiable)."""
    _global_only(process_set)
    op = _resolve_op(average, op)
    compressed, ctx = compression.compress(tensor)
    reduced = _AllreduceFn.apply(compressed, name, op, prescale_factor, postscale_factor)
    return compression.decompress(reduced, ctx)


# ----- grouped allreduce: one fused buffer per dtype -----

def _grouped_allreduce_async(tensors, in_place, name, op, prescale_factor, postscale_factor):
    tensors = list(tensors)
    if op == Adasum:
        hs = [_allreduce_async(t, t if in_place else None, name, op, prescale_factor,
                               postscale_factor) for t in tensors]
        return _handles.register(_handles.Pending([], lambda: [_handles.synchronize(h)
                                                                for h in hs]))
    by_dtype = {}
    for i, t in enumerate(tensors):
        by_dtype.setdefault(t.dtype, []).append(i)
    inner = []
    for dtype in sorted(by_dtype, key=_neg.dtype_code):  # the same order on every rank
        idx = by_dtype[dtype]
        flat = torch.cat([tensors[i].detach().reshape(-1) for i in idx])
        inner.append((idx, flat, _allreduce_async(flat, flat, name, op, prescale_factor,
                                                  postscale_factor)))

    def finish():
        out = [None] * len(tensors)
        for idx, flat, h in inner:
            _handles.synchronize(h)
            offset = 0
            for i in idx:
                t = tensors[i]
                piece = flat[offset:offset + t.numel()].view(t.shape)
                offset += t.numel()
                if in_place:
                    t.detach().copy_(piece)
                    out[i] = t
                else:
                    out[i] = piece.clone()
        return out

    return _handles.register(_handles.Pending([], finish))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    _global_only(process_set)
    return _grouped_allreduce_async(tensors, False, name, _resolve_op(average, op),
                                    prescale_factor, postscale_factor)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    _global_only(process_set)
    return _grouped_allreduce_async(tensors, True, name, _resolve_op(average, op),
                                    prescale_factor, postscale_factor)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    pairs = [compression.compress(t) for t in tensors]
    h = grouped_allreduce_async([p for p, _ in pairs], average, name, op, prescale_factor,
                                postscale_factor, process_set)
    return [compression.decompress(r, c) for r, (_, c) in zip(_handles.synchronize(h), pairs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return _handles.synchronize(grouped_allreduce_async_(tensors, average, name, op,
                                                         prescale_factor, postscale_factor,
                                                         process_set))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    raise NotImplementedError("sparse allreduce is not supported by ddp's Horovod layer; pass "
                              "sparse_as_dense=True to DistributedOptimizer")


# ----- allgather -----

def _first_dims(t):
    """Every rank's first dimension, in rank order."""
    mine = torch.tensor([t.shape[0]], dtype=torch.int64)
    dims = [torch.empty_like(mine) for _ in range(_rt.size())]
    dist.all_gather(dims, mine)
    return [int(d) for d in dims]


def _allgather_async(tensor, name):
    """(handle, every rank's first dimension)."""
    t = tensor.detach()
    if t.dim() == 0:
        t = t.reshape(1)
    t = t.contiguous()
    _negotiate(_neg.ALLGATHER, t, _trailing(t), name)
    dims = _first_dims(t)
    widest = max(dims)
    padded = t
    if t.shape[0] < widest:
        padded = torch.cat([t, t.new_zeros((widest - t.shape[0],) + tuple(t.shape[1:]))])
    parts = [torch.empty_like(padded) for _ in dims]
    work = dist.all_gather(parts, padded, async_op=True)
    return _handles.register(_handles.Pending(
        [work], lambda: torch.cat([p[:d] for p, d in zip(parts, dims)]))), dims


def allgather_async(tensor, name=None, process_set=global_process_set):
    _global_only(process_set)
    return _allgather_async(tensor, name)[0]


class _AllgatherFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name):
        handle, ctx.dims = _allgather_async(tensor, name)
        return _handles.synchronize(handle)

    @staticmethod
    def backward(ctx, grad):
        summed = _handles.synchronize(_allreduce_async(grad.contiguous(), None, None, Sum, 1.0,
                                                       1.0))
        offset = sum(ctx.dims[: _rt.rank()])
        return summed.narrow(0, offset, ctx.dims[_rt.rank()]), None


def allgather(tensor, name=None, process_set=global_process_set):
    """The ranks' tensors concatenated along the first dimension (which may differ)."""
    _global_only(process_set)
    return _AllgatherFn.apply(tensor, name)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    hs = [allgather_async(t, name, process_set) for t in tensors]
    return _handles.register(_handles.Pending([], lambda: [_handles.synchronize(h)
                                                            for h in hs]))


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    return [allgather(t, name, process_set) for t in tensors]


# ----- broadcast -----

def _broadcast_async(tensor, in_place, root_rank, name):
    if not 0 <= root_rank < _rt.size():
        raise ValueError(f"hvd.broadcast: root_rank {root_rank} is not a rank of this job "
                         f"(size {_rt.size()})")
    buf = tensor.detach()
    copied = not in_place or not buf.is_contiguous()
    if copied:
        buf = buf.clone(memory_format=torch.contiguous_format)
    _negotiate(_neg.BROADCAST, buf, buf.numel(), name, root=root_rank)
    work = dist.broadcast(buf, src=root_rank, async_op=True)
    return _handles.register(_handles.Pending(
        [work], lambda: _result(tensor, buf, in_place, copied)))


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    _global_only(process_set)
    return _broadcast_async(tensor, False, root_rank, name)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    _global_only(process_set)
    return _broadcast_async(tensor, True, root_rank, name)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return _handles.synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _BroadcastFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name):
        ctx.root_rank = root_rank
        return _handles.synchronize(_broadcast_async(tensor, False, root_rank, name))

    @staticmethod
    def backward(ctx, grad):
        summed = _handles.synchronize(_allreduce_async(grad.contiguous(), None, None, Sum, 1.0,
                                                       1.0))
        if _rt.rank() != ctx.root_rank:
            summed = summed * 0
        return summed, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """A new tensor holding root_rank's `tensor` (differentiable)."""
    _global_only(process_set)
    return _BroadcastFn.apply(tensor, root_rank, name)


# ----- alltoall -----

def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    _global_only(process_set)
    n = _rt.size()
    t = tensor.detach().contiguous()
    if t.dim() == 0:
        raise ValueError("hvd.alltoall: the tensor must have at least one dimension")
    if splits is None:
        if t.shape[0] % n:
            raise ValueError(f"hvd.alltoall: the first dimension ({t.shape[0]}) does not split "
                             f"equally over {n} ranks; pass splits")
        send = [t.shape[0] // n] * n
    else:
        send = [int(s) for s in (splits.tolist() if torch.is_tensor(splits) else splits)]
        if len(send) != n or any(s < 0 for s in send) or sum(send) != t.shape[0]:
            raise ValueError(f"hvd.alltoall: splits {send} must have {n} non-negative entries "
                             f"summing to the first dimension ({t.shape[0]})")
    _negotiate(_neg.ALLTOALL, t, _trailing(t), name)
    send_t = torch.tensor(send, dtype=torch.int64)
    recv_t = torch.empty_like(send_t)
    dist.all_to_all_single(recv_t, send_t)
    recv = [int(r) for r in recv_t]
    out = t.new_empty((sum(recv),) + tuple(t.shape[1:]))
    work = dist.all_to_all_single(out, t, output_split_sizes=recv, input_split_sizes=send,
                                  async_op=True)
    received = torch.tensor(recv, dtype=torch.int32)
    return _handles.register(_handles.Pending([work], lambda: (out, received)))


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Row blocks of `tensor` to each rank (`splits`, or equal blocks); returns what this rank
    received, and with `splits` also how many rows came from each rank."""
    out, received = _handles.synchronize(alltoall_async(tensor, splits, name, process_set))
    return out if splits is None else (out, received)


# ----- reducescatter -----

def _my_rows(rows):
    n, r = _rt.size(), _rt.rank()
    base, extra = divmod(rows, n)
    start = r * base + min(r, extra)
    return start, base + (1 if r < extra else 0)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0):
    _global_only(process_set)
    if op not in (Average, Sum):
        raise NotImplementedError(f"hvd.reducescatter: op {_OP_NAMES.get(op, op)} is not "
                                  "supported; use Average or Sum")
    buf = tensor.detach().clone(memory_format=torch.contiguous_format)
    if buf.dim() == 0:
        raise HorovodInternalError("hvd.reducescatter: a rank-zero tensor cannot be scattered")
    _negotiate(_neg.REDUCESCATTER, buf, buf.numel(), name, op)
    _scale_(buf, prescale_factor)
    # A full all-reduce, then this rank's rows: every backend has it, uneven rows included.
    work = dist.all_reduce(buf, op=dist.ReduceOp.SUM, async_op=True)
    post = postscale_factor / (_rt.size() if op == Average else 1)
    start, rows = _my_rows(buf.shape[0])
    return _handles.register(_handles.Pending(
        [work], lambda: _scale_(buf.narrow(0, start, rows).clone(), post)))


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    compressed, ctx = compression.compress(tensor)
    out = _handles.synchronize(reducescatter_async(compressed, name, op, process_set,
                                                   prescale_factor, postscale_factor))
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    return [reducescatter(t, name, compression, op, process_set, prescale_factor,
                          postscale_factor) for t in tensors]


# ----- barrier, join, handles -----

def barrier(process_set=global_process_set):
    """Returns once every rank has called it (the negotiation all-reduce is the barrier)."""
    _global_only(process_set)
    _negotiate(_neg.BARRIER, torch.zeros(1), 1, "barrier")


_IDENTITY = {Sum: 0, Average: 0, Min: float("inf"), Max: float("-inf"), Product: 1}


def _identity_tensor(dtype, count, op):
    value = _IDENTITY.get(op, 0)
    if not (dtype.is_floating_point or dtype.is_complex) and value in (float("inf"),
                                                                       float("-inf")):
        info = torch.iinfo(dtype) if dtype != torch.bool else None
        value = (info.max if value > 0 else info.min) if info else (value > 0)
    return torch.full((count,), value, dtype=dtype)


def join(device=-1):
    """This rank has no more data: it takes part in the other ranks' allreduces with the
    reduction's identity (zeros for Sum and Average, which still divides by the full size) until
    every rank has joined. Returns the rank that joined last."""
    first = True
    while True:
        header = _neg.joined_header(_rt.rank(), first)
        first = False
        try:
            dist.all_reduce(header, op=dist.ReduceOp.MAX)
        except RuntimeError as e:
            raise HorovodInternalError(f"hvd.join: {e}") from e
        outcome = _neg.Outcome(header)
        if outcome.all_joined():
            return outcome.last_joined_rank()
        kind = outcome.field(_neg.KIND)
        if kind != _neg.ALLREDUCE:
            raise HorovodInternalError(f"{_neg.KIND_NAMES.get(kind, kind)} is not supported once "
                                       "a rank has called hvd.join() (Horovod allows only "
                                       "allreduce then)")
        op = outcome.field(_neg.OP)
        dtype = _neg.DTYPES[outcome.field(_neg.DTYPE)]
        stand_in = _identity_tensor(dtype, outcome.field(_neg.COUNT), op)
        dist.all_reduce(stand_in, op=_TORCH_OPS[op])


poll = _handles.poll
synchronize = _handles.synchronize


def start_timeline(file_path, mark_cycles=False):
    raise NotImplementedError("Horovod's timeline is not part of ddp's Horovod layer; ddprun's "
                              "flight recorder and `ddprun trace` show each rank's collectives")


def stop_timeline():
    raise NotImplementedError("Horovod's timeline is not part of ddp's Horovod layer")
