"""Where ddp's Horovod API layer lives, for putting it on a job's PYTHONPATH.

    PYTHONPATH=$(python -m ddp.horovod) mpirun -np 2 python train.py   # import horovod.torch
    PYTHONPATH=$(python -m ddp.horovod) ddprun --nproc-per-node 2 train.py

Nothing is put on sys.path by `import ddp` itself, so an installed Horovod keeps working unless
a user selects this layer (ddp's horovodrun does it for its workers). docs/horovod.md.
"""

import os
import sys


def path():
    """The PYTHONPATH entries: the layer's folder (`import horovod`) and ddp's own parent."""
    here = os.path.dirname(os.path.abspath(__file__))
    return [os.path.join(here, "compat"), os.path.dirname(here)]


def pythonpath(existing=None):
    """`path()` in front of `existing` (default: this process's PYTHONPATH)."""
    existing = os.environ.get("PYTHONPATH", "") if existing is None else existing
    return os.pathsep.join(path() + ([existing] if existing else []))


if __name__ == "__main__":
    print(pythonpath())
    sys.exit(0)
