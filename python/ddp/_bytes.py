"""Bytes out of a tensor without NumPy: torch does not depend on it, and a fresh environment
with only torch and ddp has none (Tensor.numpy() there raises "Numpy is not available")."""

import torch


def tensor_bytes(t):
    """The bytes of the uint8 CPU tensor `t`, in a new bytearray (pickle.loads takes it)."""
    out = bytearray(t.numel())
    if out:  # torch.frombuffer refuses an empty buffer
        torch.frombuffer(out, dtype=torch.uint8).copy_(t.reshape(-1))
    return out
