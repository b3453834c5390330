"""The "ddp" torch.distributed backend without `import ddp`: torch's plugin entry point.

An environment where ddp is installed (pip, the wheel) declares `register` under the entry-point
group "torch.backends" (pyproject.toml), which `import torch` calls in every process of that
environment (unless TORCH_DEVICE_BACKEND_AUTOLOAD=0). So `init_process_group("ddp")` works in
scripts, Lightning (`DDPStrategy(process_group_backend="ddp")`), Accelerate and Ray Train as
they are (issue 50).

It costs a process that never uses ddp almost nothing: this module imports only what torch has
already imported, and names the backend; ddp's extension loads when the first group of the
"ddp" backend is made. Under `ddprun --recovery step` (DDP_RECOVERY=step) env:// also takes the
store ddprun hosts, as `import ddp` makes it, so the order of `import ddp` and
`init_process_group` no longer matters there.

Nothing here may fail `import torch`: a problem becomes a warning, and the backend then says
what is wrong when it is asked for.
"""

import os

BACKEND_NAME = "ddp"


def _create(backend_options, pg_options):
    """The creator torch calls for a group of the "ddp" backend: loads ddp and hands over."""
    import ddp

    return ddp._create_extended(backend_options, pg_options)


def _env_rendezvous_over_job_store(url, **kwargs):
    """env:// under ddprun --recovery step: ddp.recovery's, loaded when it is first used."""
    from ddp.recovery import _env_rendezvous_over_job_store as over_job_store

    yield from over_job_store(url, **kwargs)


def register_backend(create):
    """Registers the "ddp" backend with `create` (torch's extended creator API) for CPU tensors
    and, where torch has CUDA, CUDA tensors (staged through the host, as gloo does); nothing if
    it is registered already. Shared with `import ddp`, which registers its own creator."""
    import torch
    import torch.distributed as dist

    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    devices = ["cpu", "cuda"] if torch.backends.cuda.is_built() else ["cpu"]
    dist.Backend.register_backend(BACKEND_NAME, create, extended_api=True, devices=devices)


def install_env_rendezvous(handler):
    """Makes `handler` torch.distributed's env:// rendezvous."""
    import importlib

    # The module (torch.distributed.rendezvous is also the name of a function there).
    handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
    handlers["env"] = handler


def register():
    """torch's "torch.backends" entry point."""
    try:
        import torch.distributed as dist

        if not dist.is_available():
            return
        register_backend(_create)
        if os.environ.get("DDP_RECOVERY") == "step":
            install_env_rendezvous(_env_rendezvous_over_job_store)
    except Exception as e:  # noqa: BLE001 (import torch must not fail for ddp's sake)
        import warnings

        warnings.warn(f"ddp: the 'ddp' torch.distributed backend was not registered: {e!r}; "
                      "`import ddp` says more", RuntimeWarning, stacklevel=2)
