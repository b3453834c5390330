#!/usr/bin/env python3
"""The gpt example on 2 ranks under ddprun, a tiny model for a few dozen steps: rank 0's loss
must fall, and both ranks must end with bitwise-identical parameters (each rank prints a
checksum of its parameter bytes). The ranks train on different token streams, so the checksums
agree only if DDP averaged every gradient of every step.

Usage: examples_gpt_test.py --ddprun PATH --gpt BUILD/examples/gpt/gpt
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

# --device cpu: the test is of two ranks on the cpu backend; on a machine with one GPU, "auto"
# would put both on cuda:0, which gpt refuses (one GPU per process; seen on the H200).
TINY = ["--device", "cpu", "--steps", "40", "--batch", "4", "--seq", "16", "--context", "16", "--vocab", "64",
        "--d-model", "32", "--heads", "2", "--layers", "2", "--lr", "3e-3", "--log-every", "1"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--gpt", required=True)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ddp_gpt_") as tmp:
        cmd = [os.path.abspath(args.ddprun), "--standalone", "--nproc-per-node", "2",
               os.path.abspath(args.gpt)] + TINY
        p = subprocess.run(cmd, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=240)
    out = p.stdout
    failures = []
    if p.returncode != 0:
        failures.append(f"exited {p.returncode}")
    losses = [float(x) for x in re.findall(r"step \d+/40 \| loss (\d+\.\d+)", out)]
    if len(losses) != 40:
        failures.append(f"expected 40 loss lines from rank 0, found {len(losses)}")
    elif not (sum(losses[-5:]) / 5 < losses[0] - 0.5):
        failures.append(f"loss did not fall by 0.5: first {losses[0]}, last five {losses[-5:]}")
    if not re.search(r"Training time = [\d.]+ s \| \d+ tokens/s over 2 ranks", out):
        failures.append("no final line with the time and tokens/s over 2 ranks")
    sums = dict(re.findall(r"rank (\d) parameter checksum ([0-9a-f]{16})", out))
    if set(sums) != {"0", "1"}:
        failures.append(f"expected a checksum from ranks 0 and 1, got {sorted(sums)}")
    elif sums["0"] != sums["1"]:
        failures.append(f"the ranks' parameters differ after training: {sums}")
    if failures:
        print("FAILED: " + "; ".join(failures) + "\n--- output ---\n" + out, file=sys.stderr)
        return 1
    print(f"gpt: OK (loss {losses[0]:.4f} -> {losses[-1]:.4f}, checksum {sums['0']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
