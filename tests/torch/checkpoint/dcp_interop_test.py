#!/usr/bin/env python3
"""PyTorch 2.13's Distributed Checkpoint and ddp's checkpoints, both ways.

1. ddp writes (1 rank, Adam; 4 ranks, ZeroRedundancyOptimizer): PyTorch's
   torch.distributed.checkpoint.load reads it into an nn.Sequential and an Adam state_dict
   (get_state_dict/set_state_dict names), values equal to what ddp saved; dcp_to_torch_save
   turns it into one torch.load file.
2. PyTorch writes (dcp.save from 2 gloo processes, DDP-style replicated state, and a tensor
   sharded over 2 ranks as a DTensor): ddp loads both, values equal.

Usage: dcp_interop_test.py --tool PATH/dcp_interop
"""
import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import warnings

warnings.filterwarnings("ignore")
try:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
except ImportError as e:  # the test is registered only with the venv's python; say why anyway
    print(f"SKIP: cannot import torch.distributed.checkpoint: {e}")
    sys.exit(77)


def make_model():
    """ddp's test::make_model(base) shape; values set by the checkpoint."""
    return torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3),
                               torch.nn.ReLU(), torch.nn.Linear(3, 2))


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def ddp_writes(tool, tmp, world):
    d = os.path.join(tmp, f"ddp{world}")
    subprocess.run([tool, "write", d, str(world)], check=True, timeout=120)
    steps = sorted(glob.glob(os.path.join(d, "step-*")))
    check(len(steps) == 1, f"one checkpoint expected, found {steps}")
    ckpt = steps[0]
    files = sorted(f for f in os.listdir(ckpt) if f.endswith(".distcp"))
    check(len(files) == world, f"{world} shard files expected, found {files}")
    expected = torch.load(os.path.join(d, "expected.pt"))

    model = make_model()
    optim = torch.optim.Adam(model.parameters(), lr=0.9)
    msd, osd = get_state_dict(model, optim)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=ckpt)
    set_state_dict(model, optim, model_state_dict=state["model"], optim_state_dict=state["optim"])
    for name, p in model.named_parameters():
        check(torch.equal(p.detach(), expected[f"model.{name}"]), f"model.{name} differs")
        st = optim.state[p]
        for key in ("exp_avg", "exp_avg_sq"):
            check(torch.equal(st[key], expected[f"optim.state.{name}.{key}"]),
                  f"{name} {key} differs")
        check(float(st["step"]) == expected[f"optim.state.{name}.step"], f"{name} step differs")
    check(optim.param_groups[0]["lr"] == expected["optim.param_groups.0.lr"], "lr differs")

    one = os.path.join(tmp, f"one{world}.pt")
    dcp_to_torch_save(ckpt, one)
    sd = torch.load(one, weights_only=False)
    check(sd["trainer"]["step"] == 3 and sd["extra"]["note"] == "from ddp",
          f"trainer/extra entries: {sd.get('trainer')}, {sd.get('extra')}")
    check(torch.equal(sd["model"]["0.weight"], expected["model.0.weight"]),
          "dcp_to_torch_save's model.0.weight differs")
    print(f"PyTorch read ddp's checkpoint from {world} rank(s): OK", flush=True)


def python_worker(rank, world, init_file, out):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank,
                            world_size=world)
    torch.manual_seed(0)  # the same model on both ranks, as DDP would make it
    model = make_model()
    optim = torch.optim.Adam(model.parameters(), lr=0.05)
    for step in range(3):
        for p in model.parameters():
            p.grad = torch.sin(p.detach() * (step + 1)) * 0.1
        optim.step()
    msd, osd = get_state_dict(model, optim)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=os.path.join(out, "replicated"))
    if rank == 0:
        expected = {}
        for name, p in model.named_parameters():
            expected[f"model.{name}"] = p.detach().clone()
            for key in ("exp_avg", "exp_avg_sq"):
                expected[f"optim.state.{name}.{key}"] = optim.state[p][key].clone()
            expected[f"optim.state.{name}.step"] = float(optim.state[p]["step"])
        expected["optim.param_groups.0.lr"] = 0.05
        torch.save(expected, os.path.join(out, "expected.pt"))

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(6 * 4, dtype=torch.float32).reshape(6, 4)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    dcp.save({"model": {"w": sharded}}, checkpoint_id=os.path.join(out, "chunked"))
    if rank == 0:
        torch.save({"model.w": full}, os.path.join(out, "chunked_expected.pt"))
    dist.destroy_process_group()


def python_writes(tool, tmp):
    out = os.path.join(tmp, "py")
    os.makedirs(out)
    torch.multiprocessing.spawn(python_worker, args=(2, os.path.join(tmp, "init"), out),
                                nprocs=2, join=True)
    files = sorted(f for f in os.listdir(os.path.join(out, "chunked")) if f.endswith(".distcp"))
    check(len(files) == 2, f"PyTorch wrote the sharded tensor into {files}")
    subprocess.run([tool, "read", os.path.join(out, "replicated"),
                    os.path.join(out, "expected.pt")], check=True, timeout=120)
    subprocess.run([tool, "read-tensor", os.path.join(out, "chunked"),
                    os.path.join(out, "chunked_expected.pt")], check=True, timeout=120)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tool", required=True)
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ddp_dcp_")
    try:
        ddp_writes(args.tool, tmp, 1)
        ddp_writes(args.tool, tmp, 4)
        python_writes(args.tool, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("dcp interop: OK")


if __name__ == "__main__":
    main()
