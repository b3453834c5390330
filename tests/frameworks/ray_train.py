"""Ray Train's TorchTrainer on a local two-node Ray cluster (issue 50): a head node and a worker
node that this script starts on loopback (ray.cluster_utils.Cluster: two raylets, one CPU each),
one training worker on each node (placement STRICT_SPREAD), PyTorch DDP on a small MLP with the
backend named in TorchConfig, 20 steps; one run per backend, on the same cluster.

    ray_train.py --backends ddp,gloo

Ray starts the workers and calls init_process_group(backend) itself before the training function
runs: the "ddp" backend must be registered in Ray's worker processes without `import ddp`, which
torch's plugin entry point does (python/ddp_torch_plugin; the build tree declares it too).
Checks: the process group's backend is the one asked for, the world is 2 on two different Ray
nodes, the loss falls, and both ranks end with the same parameters. Exit 0 or 1 (the reason).
"""
import argparse
import os
import sys
import tempfile

import json  # noqa: E402

# No usage report (no network here), no metrics agent: without a dashboard agent to export to,
# every new Ray process waits about 30 s on its connection to the metrics exporter.
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_enable_metrics_collection", "0")

import ray  # noqa: E402
import ray.train  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402
from ray.train import RunConfig, ScalingConfig  # noqa: E402
from ray.train.torch import TorchConfig, TorchTrainer  # noqa: E402

STEPS = 20


def train_loop(config):
    """Each rank writes what it saw to config["out"]/rank<R>.json (the nodes share this disk)."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(
        torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(100 + rank)
    x = torch.randn(256, 8, generator=gen)
    y = x.sum(dim=1, keepdim=True)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.empty_like(flat) for _ in range(world)]
    dist.all_gather(gathered, flat)
    report = {
        "backend": dist.get_backend(), "world": world, "rank": rank,
        "node": ray.get_runtime_context().get_node_id(),
        "first_loss": losses[0], "last_loss": losses[-1],
        "same_params": all(torch.equal(g, gathered[0]) for g in gathered),
    }
    with open(os.path.join(config["out"], f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    ray.train.report({"last_loss": losses[-1]})


def fit(backend):
    """One TorchTrainer run on `backend`; the problems found (empty: it passed)."""
    with tempfile.TemporaryDirectory() as tmp:
        trainer = TorchTrainer(
            train_loop,
            train_loop_config={"out": tmp},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False,
                                         resources_per_worker={"CPU": 1},
                                         placement_strategy="STRICT_SPREAD"),
            torch_config=TorchConfig(backend=backend),
            run_config=RunConfig(storage_path=tmp, name="ray_train_" + backend))
        trainer.fit()
        reports = []
        for r in range(2):
            path = os.path.join(tmp, f"rank{r}.json")
            reports.append(json.load(open(path)) if os.path.exists(path) else {})
    print(f"ray_train: {backend}: the ranks reported {reports}", flush=True)
    problems = []
    nodes = {rep.get("node") for rep in reports}
    if None in nodes or len(nodes) != 2:
        problems.append("the two ranks did not run on two different Ray nodes")
    for r, m in enumerate(reports):
        if m.get("backend") != backend:
            problems.append(f"rank {r}: the process group's backend is {m.get('backend')!r}")
        if m.get("world") != 2:
            problems.append(f"rank {r}: world size {m.get('world')}, not 2")
        if not m.get("same_params"):
            problems.append(f"rank {r}: the ranks' parameters differ")
        if not m.get("last_loss", 1e9) < m.get("first_loss", 0):
            problems.append(f"rank {r}: the loss did not fall: {m.get('first_loss')} -> "
                            f"{m.get('last_loss')}")
    if not problems:
        print(f"PASS: Ray Train's TorchTrainer on the {backend} backend, 2 workers on 2 Ray "
              f"nodes, loss {reports[0]['first_loss']:.3f} -> {reports[0]['last_loss']:.3f}",
              flush=True)
    return [f"{backend}: {p}" for p in problems]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="ddp,gloo")
    args = ap.parse_args()

    node_args = {"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024,
                 "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=node_args)
    try:
        cluster.add_node(**node_args)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
        alive = [n for n in ray.nodes() if n["Alive"]]
        print(f"ray_train: a cluster of {len(alive)} nodes at {cluster.address}", flush=True)
        problems = [] if len(alive) == 2 else [f"the cluster has {len(alive)} nodes, not 2"]
        for backend in args.backends.split(","):
            problems += fit(backend)
        for p in problems:
            print("FAIL:", p, flush=True)
        return 1 if problems else 0
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    sys.exit(main())
