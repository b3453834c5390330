"""Horovod's helpers over the collectives: parameters, optimizer state and Python objects."""

import pickle

import torch

from ddp._bytes import tensor_bytes

from . import handles as _handles
from . import mpi_ops as _ops
from . import runtime as _rt


def broadcast_parameters(params, root_rank):
    """Overwrites every rank's parameters with root_rank's, in place.

    `params`: a state_dict (model.state_dict()), or (name, tensor) pairs
    (model.named_parameters()), or a list of tensors.
    """
    if isinstance(params, dict):
        items = sorted(params.items())
    else:
        items = list(params)
        if items and not isinstance(items[0], tuple):
            items = [(f"param.{i}", p) for i, p in enumerate(items)]
    handles = []
    for name, p in items:
        if p is None:
            continue
        if not torch.is_tensor(p):
            raise ValueError(f"hvd.broadcast_parameters: {name} is a {type(p).__name__}, not a "
                             "tensor; pass model.state_dict() or model.named_parameters()")
        handles.append(_ops.broadcast_async_(p.data, root_rank, name))
    for h in handles:
        _handles.synchronize(h)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Gives every rank root_rank's optimizer state (state tensors and hyper-parameters).

    The whole state_dict travels as one object; an optimizer with no state yet stays so on
    every rank (its state is created identically by the first step, since the gradients are
    averaged).
    """
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state = broadcast_object(optimizer.state_dict(), root_rank, "optimizer_state")
    if _rt.rank() != root_rank:
        optimizer.load_state_dict(state)


def _to_bytes(obj):
    return torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)


def broadcast_object(obj, root_rank=0, name=None, process_set=_ops.global_process_set):
    """root_rank's `obj` (pickled) on every rank."""
    name = name or type(obj).__name__
    if _rt.rank() == root_rank:
        payload = _to_bytes(obj)
        size = torch.tensor([payload.numel()], dtype=torch.int64)
        _ops.broadcast_(size, root_rank, name + ".sz", process_set)
        _ops.broadcast_(payload, root_rank, name + ".t", process_set)
        return obj
    size = torch.zeros(1, dtype=torch.int64)
    _ops.broadcast_(size, root_rank, name + ".sz", process_set)
    payload = torch.zeros(int(size.item()), dtype=torch.uint8)
    _ops.broadcast_(payload, root_rank, name + ".t", process_set)
    return pickle.loads(tensor_bytes(payload))


def allgather_object(obj, name=None):
    """Every rank's `obj`, in rank order."""
    name = name or type(obj).__name__
    payload = _to_bytes(obj)
    sizes = _ops.allgather(torch.tensor([payload.numel()], dtype=torch.int64), name + ".sz")
    data = tensor_bytes(_ops.allgather(payload, name + ".t"))
    out, offset = [], 0
    for n in sizes.tolist():
        out.append(pickle.loads(data[offset:offset + n]))
        offset += n
    return out
