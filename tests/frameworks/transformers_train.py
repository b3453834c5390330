"""A small Transformers Trainer run for launchers (ddprun, torchrun).

    HF_HUB_OFFLINE=1 ddprun --standalone --nproc-per-node 2 transformers_train.py [--backend gloo|ddp]

Trains a 2-layer GPT-2 built from a GPT2Config (vocabulary 64, width 32: nothing is downloaded)
on synthetic token sequences that count upwards modulo the vocabulary (next token = this token
+ 1), with `transformers.Trainer` on the CPU (TrainingArguments(use_cpu=True)). The Trainer
reads the launcher's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_* variables (through Accelerate),
shards the data and wraps the model in DistributedDataParallel. Prints one JSON line from rank
0: the world size, the process group's backend (torch.distributed.get_backend()), the first
and last logged training loss (the Trainer's mean over the ranks), and whether every rank ended
with the same parameters.

--backend picks the process group's backend:
  auto  the Trainer's choice (gloo on the CPU, or mpi when torch has it).
  gloo  TrainingArguments(ddp_backend="gloo").
  ddp   `import ddp` and torch.distributed.init_process_group("ddp") before TrainingArguments;
        the Trainer (Accelerate's PartialState underneath) joins that group. ddp_backend="ddp"
        is refused: the command line (HfArgumentParser) allows only nccl, gloo, mpi, xccl,
        hccl, cncl, mccl, and Accelerate's PartialState raises "Your assigned backend ddp is not
        available, please use gloo" for any CPU backend but gloo and mpi.

Exit status 1 when the loss did not fall, the ranks disagree, the run was not distributed
(world 1 under a launcher of several processes) or the backend is not the one asked for.
"""
import argparse
import gc
import json
import os
import sys
import tempfile
import weakref

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from transformers import (GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback,  # noqa: E402
                          TrainingArguments)

VOCAB = 64
SEQ = 16


class CountingTokens(torch.utils.data.Dataset):
    """Sequences start, start + 1, ... (mod VOCAB) from a fixed random start per item."""

    def __init__(self, n):
        self.starts = torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(1))

    def __len__(self):
        return len(self.starts)

    def __getitem__(self, i):
        ids = (self.starts[i] + torch.arange(SEQ)) % VOCAB
        return {"input_ids": ids, "labels": ids.clone()}


class LossLog(TrainerCallback):
    def __init__(self):
        self.losses = []

    def on_log(self, args, state, control, logs=None, **kwargs):
        if logs and "loss" in logs:
            self.losses.append(float(logs["loss"]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", choices=["auto", "gloo", "ddp"], default="auto")
    p.add_argument("--steps", type=int, default=30)
    a = p.parse_args()

    if a.backend == "ddp":
        import ddp  # noqa: F401  registers the "ddp" backend with torch.distributed
        dist.init_process_group("ddp")

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=32, n_layer=2,
                                       n_head=2, bos_token_id=0, eos_token_id=0))
    log = LossLog()
    with tempfile.TemporaryDirectory(prefix="ddp-transformers-") as out:
        args = TrainingArguments(
            output_dir=out, use_cpu=True, max_steps=a.steps, per_device_train_batch_size=8,
            learning_rate=3e-3, warmup_steps=0, logging_steps=1, report_to=[],
            save_strategy="no", disable_tqdm=True, dataloader_num_workers=0, seed=0,
            ddp_backend="gloo" if a.backend == "gloo" else None)
        trainer = Trainer(model=model, args=args, train_dataset=CountingTokens(1024),
                          callbacks=[log])
        trainer.train()

    world = dist.get_world_size() if dist.is_initialized() else 1
    backend = dist.get_backend() if dist.is_initialized() else None
    rank = dist.get_rank() if dist.is_initialized() else 0
    flat = torch.cat([q.detach().reshape(-1) for q in model.parameters()])
    if dist.is_initialized():
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
    else:
        gathered = [flat]
    same = all(torch.equal(g, gathered[0]) for g in gathered)
    launched = int(os.environ.get("WORLD_SIZE", "1"))
    problems = []
    if not same:
        problems.append("the ranks' parameters differ")
    if len(log.losses) < 2 or not log.losses[-1] < log.losses[0]:
        problems.append(f"the loss did not fall: {log.losses}")
    if args.world_size != launched or world != launched:
        problems.append(f"the Trainer trains {args.world_size} process(es) in a group of {world} "
                        f"but WORLD_SIZE is {launched}")
    if a.backend != "auto" and backend != a.backend:
        problems.append(f"the process group's backend is {backend}, not {a.backend}")
    if rank == 0:
        print(json.dumps({"bench": "framework", "framework": "transformers", "world": world,
                          "parallel_mode": str(args.parallel_mode), "backend": backend,
                          "first_loss": log.losses[0] if log.losses else None,
                          "last_loss": log.losses[-1] if log.losses else None,
                          "ranks_equal": same, "ok": not problems}), flush=True)
    for problem in problems:
        print(f"transformers_train: rank {rank}: {problem}", file=sys.stderr)
    # PyTorch 2.13 with gloo can hang at exit unless the DistributedDataParallel wrapper goes
    # before the process group: when the wrapper's Reducer holds the group's last reference,
    # freeing it runs ~ProcessGroupGloo with the GIL held, which joins gloo's worker threads,
    # and a worker still releasing the Python tensors of the last collective (the all_gather
    # above) waits for the GIL. destroy_process_group() frees the group without the GIL.
    if dist.is_initialized():
        wrapper = weakref.ref(trainer.model_wrapped)
        del trainer
        gc.collect()
        if wrapper() is not None:
            print(f"transformers_train: rank {rank}: the DDP wrapper outlived the Trainer",
                  file=sys.stderr)
        dist.destroy_process_group()
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
