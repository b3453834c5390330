"""ddp's implementation of Horovod's PyTorch API (`import horovod.torch as hvd`).

This directory is put on sys.path only when a user asks for it (ddp's `horovodrun`, or
`PYTHONPATH=$(python -m ddp.horovod)`), so an installed Horovod is never shadowed by accident.
Collectives run on torch.distributed with ddp's backend (docs/horovod.md).
"""

# The release whose API this layer follows; scripts that print hvd.__version__ see it.
__version__ = "0.28.1"
