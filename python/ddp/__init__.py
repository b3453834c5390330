"""ddp's collectives as a torch.distributed backend.

    import ddp                                  # registers the "ddp" backend
    import torch.distributed as dist
    dist.init_process_group("ddp")              # env:// (torchrun or ddprun), tcp://, file://,
                                                # or store=, rank=, world_size=

The backend runs ddp's `cpu` backend (shared memory within a host, Gloo between hosts) and
rendezvouses through the store torch.distributed hands it. See docs/python.md.
"""

import torch
import torch.distributed as _dist

from ._build_info import TORCH_VERSION as _BUILT_FOR_TORCH


def _check_torch_version():
    # The extension is compiled against one torch release's C++ ABI: another torch fails to load
    # it with an undefined symbol at best. Say which two versions met instead.
    found = torch.__version__.split("+")[0]
    if found != _BUILT_FOR_TORCH:
        raise ImportError(
            f"ddp was built against torch {_BUILT_FOR_TORCH}, but this environment has torch "
            f"{torch.__version__} ({torch.__file__}); rebuild ddp for it: pip install "
            f"--force-reinstall --no-deps <ddp checkout> (or scripts/build.sh in the checkout)")


_check_torch_version()

from . import _C  # noqa: E402  (after the version check, which names the mismatch)

import atexit as _atexit  # noqa: E402

# Before Python finalizes: a future's callback still running on a group's completer thread (or
# dropping its Python objects) would take the GIL during finalization, which ends that thread
# in a way that aborts the process (a rank that raised an error then died of SIGABRT instead of
# exiting with its error). Registered at import, so it runs after the user's own atexit hooks.
_atexit.register(_C._quiesce_for_exit, 5.0)

__all__ = ["BACKEND_NAME", "StepManager", "recovery_enabled"]

BACKEND_NAME = "ddp"


def _group_name(group_id):
    # torch numbers groups in creation order: the default group is "0", new_group()s "1", ...
    return "default_pg" if str(group_id) in ("", "0") else "group_" + str(group_id)


def _create_extended(backend_options, pg_options):
    """torch 1.13 / 2.0 extended creator: gets the group id for messages."""
    if pg_options is not None:
        raise RuntimeError("backend ddp takes no pg_options")
    o = backend_options
    return _C._create_process_group(o.store, o.group_rank, o.group_size, o.timeout,
                                    _group_name(getattr(o, "group_id", "")))


def _create(store, rank, size, timeout):
    return _C._create_process_group(store, rank, size, timeout, "default_pg")


def _register():
    if BACKEND_NAME.upper() in getattr(_dist.Backend, "_plugins", {}):
        return  # already registered (module reloaded)
    import inspect

    params = inspect.signature(_dist.Backend.register_backend).parameters
    if "devices" in params:
        # torch >= 2.1: the creator returns a c10d Backend that torch wraps for CPU tensors and,
        # where torch has CUDA, for CUDA tensors (staged through the host, as gloo does). torch
        # makes one backend for all the device types of a group that name the same backend.
        devices = ["cpu", "cuda"] if torch.backends.cuda.is_built() else ["cpu"]
        _dist.Backend.register_backend(BACKEND_NAME, _create_extended, extended_api=True,
                                       devices=devices)
    elif "extended_api" in params:
        _dist.Backend.register_backend(BACKEND_NAME, _create_extended, extended_api=True)
    else:
        _dist.Backend.register_backend(BACKEND_NAME, _create)


_register()


from .recovery import StepManager, recovery_enabled  # noqa: E402

if recovery_enabled():
    # ddprun --recovery step hosts the job's store: env:// must use it (docs/recovery.md).
    from .recovery import _install_env_rendezvous

    _install_env_rendezvous()
