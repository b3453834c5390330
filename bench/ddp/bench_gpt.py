"""PyTorch DDP reference for bench_gpt: the same GPT-style model (include/ddp/torch/models/gpt.hpp:
same layers, parameter names and order, initialization), the same Markov-chain tokens
(markov_tokens.hpp, bit for bit), AdamW (lr 1e-3, betas 0.9/0.95, weight decay 0.1), the same
batch and sequence length per rank, one intra-op thread per rank,
torch.nn.parallel.DistributedDataParallel on gloo, W processes. Prints one JSON line (rank 0).

Usage: $DDP_PYTHON bench_gpt.py --world 2 [--steps 20] [--warmup 3] [--batch 8] [--seq 128]
                                [--vocab 8192] [--d-model 384] [--heads 6] [--layers 6] [--untied]

The batches of all steps are generated before the timed loop, as bench_gpt does. With the same
seed both programs start from the same parameters (`init_abs_sum`) and see the same tokens
(`tokens_checksum`), so their `first_loss` agrees to float rounding.
"""
import argparse
import json
import math
import os
import socket
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def finalize(z):
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def mix(h, v):
    return finalize(h ^ ((v + GOLDEN) & MASK))


class SplitMix64:
    def __init__(self, seed):
        self.state = seed

    def __call__(self):
        self.state = (self.state + GOLDEN) & MASK
        return finalize(self.state)


class MarkovTokens:
    """markov_tokens.hpp's chain: the same successor table and the same rows."""

    def __init__(self, vocab, branching=4, seed=0):
        self.vocab, self.branching, self.seed = vocab, branching, seed
        rng = SplitMix64(mix(seed, 0))
        self.successors = [rng() % vocab for _ in range(vocab * branching)]

    def batch(self, rank, step, batch, seq):
        key = mix(mix(mix(self.seed, 1), rank), step)
        rows = []
        for r in range(batch):
            rng = SplitMix64(mix(key, r))
            token = rng() % self.vocab
            row = [token]
            for _ in range(seq):
                token = self.successors[token * self.branching + rng() % self.branching]
                row.append(token)
            rows.append(row)
        return torch.tensor(rows, dtype=torch.int64)


class Attention(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.heads = heads

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(x).split(d, dim=2)
        q, k, v = (y.view(b, t, self.heads, d // self.heads).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, d))


class Mlp(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.c_proj = nn.Linear(4 * d, d)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = Attention(d, heads)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = Mlp(d)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Gpt(nn.Module):
    def __init__(self, vocab, context, d, heads, layers, tied=True, std=0.02):
        super().__init__()
        self.wte = nn.Embedding(vocab, d)
        self.wpe = nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = None if tied else nn.Linear(d, vocab, bias=False)
        # gpt.hpp's order: the layers' own resets above, then these draws.
        residual_std = std / math.sqrt(2 * layers)
        with torch.no_grad():
            self.wte.weight.normal_(0.0, std)
            self.wpe.weight.normal_(0.0, std)
            for block in self.blocks:
                for linear, s in ((block.attn.c_attn, std), (block.attn.c_proj, residual_std),
                                  (block.mlp.c_fc, std), (block.mlp.c_proj, residual_std)):
                    linear.weight.normal_(0.0, s)
                    linear.bias.zero_()
            if self.lm_head is not None:
                self.lm_head.weight.normal_(0.0, std)

    def forward(self, tokens):
        t = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(t, dtype=torch.int64))
        for block in self.blocks:
            x = block(x)
        x = self.ln_f(x)
        return self.lm_head(x) if self.lm_head is not None else F.linear(x, self.wte.weight)


def worker(rank, world, port, args):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    text = MarkovTokens(args.vocab, args.branching, 0)
    total = args.warmup + args.steps
    batches = [text.batch(rank, s, args.batch, args.seq) for s in range(total)]
    tokens_checksum = int(sum(int(x) * (i + 1) for i, x in enumerate(batches[0].flatten())))
    torch.manual_seed(0)
    net = Gpt(args.vocab, max(args.seq, 128), args.d_model, args.heads, args.layers, not args.untied)
    params = sum(p.numel() for p in net.parameters())
    init_abs_sum = sum(p.detach().double().abs().sum().item() for p in net.parameters())
    model = nn.parallel.DistributedDataParallel(net)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    times = {"step": [], "forward": [], "backward": [], "optimizer": []}
    losses = []

    def step(i, timed):
        tokens = batches[i]
        t0 = time.perf_counter()
        opt.zero_grad()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), tokens[:, 1:].reshape(-1))
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        losses.append(loss.item())
        if timed:
            t4 = time.perf_counter()
            for k, v in (("forward", t1 - t0), ("backward", t2 - t1), ("optimizer", t3 - t2),
                         ("step", t4 - t0)):
                times[k].append(1e3 * v)

    for i in range(args.warmup):
        step(i, False)
    dist.barrier()
    begin = time.perf_counter()
    cpu_begin = time.process_time()  # all threads of this process, like the C++ bench
    for i in range(args.steps):
        step(args.warmup + i, True)
    # The slowest rank's figure of each: elapsed, CPU per step, medians of the phases.
    stats = torch.tensor([time.perf_counter() - begin,
                          1e3 * (time.process_time() - cpu_begin) / args.steps] +
                         [statistics.median(times[k]) for k in
                          ("step", "forward", "backward", "optimizer")], dtype=torch.float64)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    if rank == 0:
        seconds = stats[0].item()
        tokens = world * args.batch * args.seq * args.steps
        print(json.dumps({
            "bench": "gpt", "impl": "pytorch", "world": world,
            "tokens_per_s": tokens / seconds, "step_ms_median": stats[2].item(),
            "params": params, "forward_ms_median": stats[3].item(),
            "backward_ms_median": stats[4].item(), "optimizer_ms_median": stats[5].item(),
            "cpu_ms_per_step_max_rank": stats[1].item(), "seconds": seconds,
            "steps": args.steps, "warmup": args.warmup, "batch_per_rank": args.batch,
            "seq": args.seq, "vocab": args.vocab, "d_model": args.d_model, "heads": args.heads,
            "layers": args.layers, "tied": not args.untied, "threads_per_rank": 1,
            "optimizer": "AdamW 1e-3 (0.9, 0.95) wd 0.1", "backend": "gloo",
            "first_loss": losses[0], "mean_loss": sum(losses) / len(losses),
            "init_abs_sum": init_abs_sum, "tokens_checksum": tokens_checksum,
            "torch": torch.__version__}), flush=True)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--branching", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--untied", action="store_true")
    args = parser.parse_args()
    with socket.socket() as s:  # port chosen by binding port 0
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(worker, nprocs=args.world, args=(args.world, port, args))


if __name__ == "__main__":
    main()
