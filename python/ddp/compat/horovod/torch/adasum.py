"""Adasum (Maleki et al., 2020): an adaptive sum of the ranks' gradients.

Two vectors a and b combine as (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b: orthogonal
gradients add, identical ones average. Ranks combine pairwise in a binary tree, neighbours
first (0 with 1, 2 with 3, then {0,1} with {2,3}, ...), as Horovod does on the CPU, which also
limits it to a power-of-two number of ranks. Here every rank gathers all inputs and computes the
same tree, with dot products in float64, so all ranks get identical results.
"""

import torch


def combine(a, b):
    a64, b64 = a.double(), b.double()
    dot = torch.dot(a64, b64)
    na, nb = torch.dot(a64, a64), torch.dot(b64, b64)
    ca = 1.0 - dot / (2.0 * na) if na > 0 else torch.tensor(1.0, dtype=torch.float64)
    cb = 1.0 - dot / (2.0 * nb) if nb > 0 else torch.tensor(1.0, dtype=torch.float64)
    return (ca * a64 + cb * b64).to(a.dtype)


def tree(vectors):
    """Adasum over `vectors` (flat tensors, one per rank, in rank order)."""
    level = list(vectors)
    while len(level) > 1:
        level = [combine(level[i], level[i + 1]) for i in range(0, len(level), 2)]
    return level[0]


def is_power_of_two(n):
    return n > 0 and n & (n - 1) == 0
