#!/usr/bin/env python3
"""The mnist example resumed at a random mid-epoch step, 3 seeds: the resumed run prints
"Resuming from <dir>/step-N at step N" for the newest checkpoint before the stop, then trains
steps N+1... with losses bit-for-bit equal to an uninterrupted run's (the sampler position,
RNG, model and Adam state all came back).

Usage: mnist_resume_test.py --ddprun PATH --mnist PATH
"""
import argparse
import os
import random
import re
import shutil
import tempfile

from mnist_runs import run

EPOCHS, STEPS_PER_EPOCH = 2, 20


def losses(path):
    with open(path) as f:
        return dict(line.split() for line in f)


def one_seed(args, seed, rng, tmp):
    every = rng.randint(3, 7)
    total = EPOCHS * STEPS_PER_EPOCH
    stop = rng.choice([s for s in range(every + 1, total) if s % STEPS_PER_EPOCH != 0])
    print(f"seed {seed}: checkpoint every {every} steps, stopped after step {stop}", flush=True)
    train = [args.ddprun, "--standalone", "--nproc-per-node", "2", args.mnist, "--epochs",
             str(EPOCHS), "--max-steps", str(STEPS_PER_EPOCH), "--batch-size", "16", "--seed",
             str(seed), "--test-images", "0"]  # the losses are compared, not the accuracy
    work = os.path.join(tmp, str(seed))
    os.makedirs(work)
    full_out = run(train + ["--loss-log", "full.log"], work)
    assert "| no test evaluation (--test-images 0)" in full_out, full_out
    ckpt = ["--checkpoint-every", str(every), "--checkpoint-dir", "ckpt"]
    run(train + ckpt + ["--total-steps", str(stop), "--loss-log", "first.log"], work)
    out = run(train + ckpt + ["--loss-log", "resumed.log"], work)

    newest = stop - stop % every
    m = re.search(r"Resuming from (\S+) at step (\d+)", out)
    assert m, f"no resume line\n{out}"
    assert m.group(1) == f"ckpt/step-{newest:08d}" and int(m.group(2)) == newest, m.group(0)
    full, resumed = losses(os.path.join(work, "full.log")), losses(
        os.path.join(work, "resumed.log"))
    assert sorted(map(int, resumed)) == list(range(newest + 1, total + 1)), sorted(resumed)
    for step, loss in resumed.items():
        assert loss == full[step], f"step {step}: resumed loss {loss}, uninterrupted {full[step]}"
    print(f"  resumed at step {newest}: {len(resumed)} losses bitwise equal", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--mnist", required=True)
    args = ap.parse_args()
    args.ddprun, args.mnist = os.path.abspath(args.ddprun), os.path.abspath(args.mnist)
    base = random.randrange(1 << 20)
    rng = random.Random(base)
    print(f"base seed {base}", flush=True)
    tmp = tempfile.mkdtemp(prefix="ddp_mnist_resume_")
    try:
        for seed in (base, base + 1, base + 2):
            one_seed(args, seed, rng, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print("mnist resume: OK")


if __name__ == "__main__":
    main()
