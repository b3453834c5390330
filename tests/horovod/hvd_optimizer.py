"""hvd.DistributedOptimizer against PyTorch's DistributedDataParallel, same seed, same data.

Both train the same small network on every rank's own batches: the Horovod-API model through
hvd.DistributedOptimizer (on the job's default group), the reference through
torch.nn.parallel.DistributedDataParallel on a gloo group of the same ranks. After each step
the parameters must agree. Then the optimizer's options: backward_passes_per_step,
gradient_predivide_factor, fp16 compression, groups, synchronize()/skip_synchronize(), and the
misuse errors Horovod raises.
"""

import os
import sys

import torch
import torch.distributed as dist

import horovod.torch as hvd


def net(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4),
                               torch.nn.Tanh(), torch.nn.Linear(4, 1))


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(6, 8, generator=g)
    return x, x[:, :3].sum(dim=1, keepdim=True)


def params(m):
    return torch.cat([p.detach().reshape(-1) for p in m.parameters()])


def assert_close(a, b, what, tol=1e-5):
    if not torch.allclose(a, b, atol=tol, rtol=tol):
        raise AssertionError(f"rank {hvd.rank()}: {what}: max difference "
                             f"{(a - b).abs().max().item():.3g}")


def train_against_ddp(steps, passes=1, **hvd_options):
    """Parameters of (hvd model, DDP model) after `steps` optimizer steps of `passes` batches."""
    r = hvd.rank()
    model = net(0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(),
                                   backward_passes_per_step=passes, **hvd_options)
    ref = torch.nn.parallel.DistributedDataParallel(net(0), process_group=GLOO)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    for step in range(steps):
        opt.zero_grad()
        ref_opt.zero_grad()
        for k in range(passes):
            x, y = batch(step * passes + k, r)
            torch.nn.functional.mse_loss(model(x), y).div(passes).backward()
            if k < passes - 1:
                with ref.no_sync():
                    torch.nn.functional.mse_loss(ref(x), y).div(passes).backward()
            else:
                torch.nn.functional.mse_loss(ref(x), y).div(passes).backward()
        opt.step()
        ref_opt.step()
    return params(model), params(ref.module)


def main():
    global GLOO
    hvd.init()
    GLOO = dist.new_group(backend="gloo")
    r = hvd.rank()
    checks = 0

    mine, ref = train_against_ddp(8)
    assert_close(mine, ref, "DistributedOptimizer vs DDP")
    assert_close(mine, hvd.broadcast(mine, 0), "ranks' parameters differ")
    checks += 2
    mine, ref = train_against_ddp(4, passes=2)
    assert_close(mine, ref, "backward_passes_per_step=2 vs DDP no_sync")
    checks += 1
    mine, ref = train_against_ddp(4, gradient_predivide_factor=2.0)
    assert_close(mine, ref, "gradient_predivide_factor=2 (still an average)")
    checks += 1
    os.environ["HOROVOD_FUSION_THRESHOLD"] = "64"  # one parameter per bucket
    mine, ref = train_against_ddp(4)
    del os.environ["HOROVOD_FUSION_THRESHOLD"]
    assert_close(mine, ref, "small buckets")
    checks += 1
    mine, ref = train_against_ddp(4, groups=2)
    assert_close(mine, ref, "groups=2")
    mine, ref = train_against_ddp(4, compression=hvd.Compression.fp16)
    assert_close(mine, ref, "fp16 compression", tol=2e-3)
    checks += 2

    # synchronize(), then step() under skip_synchronize(): gradient clipping's pattern.
    model = net(0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = batch(0, r)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.synchronize()
    averaged = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    assert_close(averaged, hvd.allreduce(averaged), "synchronize() leaves averaged gradients")
    with opt.skip_synchronize():
        opt.step()
    assert_close(params(model), hvd.broadcast(params(model), 0), "skip_synchronize step")
    checks += 2
    # Misuse, with Horovod's errors.
    x, y = batch(1, r)
    torch.nn.functional.mse_loss(model(x), y).backward()
    try:
        opt.zero_grad()
        raise SystemExit("zero_grad between backward and step did not raise")
    except AssertionError as e:
        if "zero_grad" not in str(e):
            raise
    try:
        torch.nn.functional.mse_loss(model(x), y).backward()
        raise SystemExit("a second backward with backward_passes_per_step=1 did not raise")
    except AssertionError as e:
        if "backward_passes_per_step" not in str(e):
            raise
    checks += 2
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=[("w", model[0].weight)])
        raise SystemExit("unnamed parameters were accepted")
    except ValueError as e:
        if "not named" not in str(e):
            raise
    checks += 1
    if not isinstance(opt, torch.optim.SGD):
        raise SystemExit("the wrapped optimizer is not an instance of its class")
    checks += 1
    hvd.shutdown()
    if r == 0:
        print(f"hvd_optimizer: {checks} checks passed on {hvd_size} ranks", flush=True)


if __name__ == "__main__":
    hvd_size = int(os.environ.get("WORLD_SIZE", "1"))
    try:
        main()
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
