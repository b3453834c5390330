"""The header every collective of this layer sends ahead of its data: Horovod's negotiation.

Horovod's coordinator checks that all ranks submitted the same operation and lets ranks that
called hvd.join() take part in the others' allreduces with zeros. Here each collective first
all-reduces a small int64 header (one MAX all-reduce, issued asynchronously, so an active rank
does not wait for it): every field x travels as x and -x, so the result gives each field's
maximum and minimum over the ranks that are still active, and a mismatch (one rank broadcasts
while another all-reduces, shapes or dtypes differ) is an error with the two values, not a hang
or garbage. A joined rank sends neutral fields and active=0; from the header it learns which
allreduce the active ranks run and joins it with the reduction's identity element.
"""

import torch

# Field order in the header.
ACTIVE, JOINING_NOW, KIND, DTYPE, COUNT, OP, ROOT = range(7)
_FIELDS = 7
_NEUTRAL = -(2**62)  # below every real field value and its negation

ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER, BARRIER, ADASUM = range(1, 8)
KIND_NAMES = {ALLREDUCE: "allreduce", ALLGATHER: "allgather", BROADCAST: "broadcast",
              ALLTOALL: "alltoall", REDUCESCATTER: "reducescatter", BARRIER: "barrier",
              ADASUM: "allreduce(op=Adasum)"}
_FIELD_NAMES = {KIND: "operation", DTYPE: "dtype", COUNT: "element count", OP: "reduction",
                ROOT: "root rank"}

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.uint8, torch.int8,
          torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]


def dtype_code(dtype):
    try:
        return DTYPES.index(dtype)
    except ValueError:
        raise TypeError(f"ddp's Horovod layer does not reduce tensors of {dtype}") from None


def active_header(kind, dtype, count, op=0, root=0):
    h = torch.zeros(2 * _FIELDS, dtype=torch.int64)
    values = {ACTIVE: 1, JOINING_NOW: _NEUTRAL, KIND: kind, DTYPE: dtype_code(dtype),
              COUNT: count, OP: op, ROOT: root}
    for i, x in values.items():
        h[i] = x
        h[_FIELDS + i] = -x if x != _NEUTRAL else _NEUTRAL
    return h


def joined_header(rank, first_round):
    h = torch.full((2 * _FIELDS,), _NEUTRAL, dtype=torch.int64)
    h[ACTIVE] = 0
    h[_FIELDS + ACTIVE] = 0
    h[JOINING_NOW] = rank + 1 if first_round else 0
    return h


class Outcome:
    """The reduced header: each field's max and min over the active ranks."""

    def __init__(self, reduced):
        r = reduced.tolist()
        self._max = r[:_FIELDS]
        self._min = [-x for x in r[_FIELDS:]]

    def all_joined(self):
        return self._max[ACTIVE] == 0

    def someone_joined(self):
        return self._min[ACTIVE] == 0

    def last_joined_rank(self):
        return self._max[JOINING_NOW] - 1

    def field(self, i):
        return self._max[i]

    def mismatch(self, fields):
        """A message naming the first field the active ranks disagree on, or None."""
        for i in fields:
            if self._max[i] != self._min[i]:
                lo, hi = self._min[i], self._max[i]
                if i == KIND:
                    lo, hi = KIND_NAMES.get(lo, lo), KIND_NAMES.get(hi, hi)
                elif i == DTYPE:
                    lo, hi = DTYPES[lo], DTYPES[hi]
                return f"the ranks disagree on the {_FIELD_NAMES[i]}: {lo} on one, {hi} on another"
        return None
