#!/usr/bin/env python3
"""End-to-end checks of the examples under ddprun: message_passing delivers to every rank,
toy resumes from its snapshot at the right epoch, mnist prints the tutorial's lines and a
final line with time, throughput and accuracy.

Usage: examples_test.py --ddprun PATH --bin-dir BUILD/examples
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile


def run(cmd, cwd, timeout=300):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}\n{p.stdout}")
    return p.stdout


def expect(cond, what, out):
    if not cond:
        raise AssertionError(f"{what}\n--- output ---\n{out}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ddprun", required=True)
    ap.add_argument("--bin-dir", required=True)
    args = ap.parse_args()
    args.ddprun, args.bin_dir = os.path.abspath(args.ddprun), os.path.abspath(args.bin_dir)
    launch = [args.ddprun, "--standalone"]
    tmp = tempfile.mkdtemp(prefix="ddp_examples_")
    try:
        out = run(launch + ["--nproc-per-node", "3",
                            os.path.join(args.bin_dir, "message_passing", "message_passing")], tmp)
        for r in (1, 2):
            expect(f"Rank 0 sent data to Rank {r}" in out, f"rank 0 did not send to {r}", out)
            expect(f"Rank {r} has received data from rank 0: 42" in out, f"rank {r} got nothing",
                   out)
        print("message_passing: OK", flush=True)

        toy = os.path.join(args.bin_dir, "toy", "toy")
        out = run(launch + ["--nproc-per-node", "2", toy, "3", "1"], tmp)
        expect("[RANK0] Epoch 0 | Batchsize: 32 | Steps: 32" in out, "tutorial epoch line", out)
        expect("Epoch 2 | Training snapshot saved at snapshot.pt" in out, "snapshot line", out)
        out = run(launch + ["--nproc-per-node", "2", toy, "5", "1"], tmp)
        expect("Resuming training from snapshot at Epoch 3" in out, "resume line", out)
        expect("[RANK0] Epoch 2 |" not in out and "[RANK0] Epoch 3 |" in out,
               "resumed run must start at epoch 3", out)
        print("toy: OK", flush=True)

        # toy --recovery step: a kill -9 of rank 1 in step 100 costs that step only: ddprun
        # restarts rank 1 alone, rank 0 drops the step, heals rank 1 and redoes it, and the
        # parameters end bitwise equal to a run without the kill (the digest).
        step_cmd = [args.ddprun, "--standalone", "--nproc-per-node", "2", "--recovery", "step",
                    "--max-restarts", "1", toy, "20", "1", "--recovery", "step"]
        clean = run(step_cmd, tmp)
        digest = re.search(r"parameters ([0-9a-f]{16}) \| steps dropped 0", clean)
        expect(digest is not None, "toy --recovery step: a digest and no step dropped", clean)
        os.environ.update(DDP_TEST_KILL_AT_STEP="100", DDP_TEST_KILL_RANK="1")
        try:
            killed = run(step_cmd, tmp)
        finally:
            del os.environ["DDP_TEST_KILL_AT_STEP"], os.environ["DDP_TEST_KILL_RANK"]
        expect("restarting only rank 1 (--recovery step" in killed,
               "toy --recovery step: ddprun restarts rank 1 alone", killed)
        expect(f"parameters {digest.group(1)} | steps dropped 1" in killed,
               "toy --recovery step: the same parameters as without the kill, one step dropped",
               killed)
        print(f"toy --recovery step: OK (parameters {digest.group(1)} with and without a kill)",
              flush=True)

        out = run(launch + ["--nproc-per-node", "2", os.path.join(args.bin_dir, "mnist", "mnist"),
                            "--max-steps", "30", "--batch-size", "16"], tmp)
        expect("Entering training loop..." in out, "start line", out)
        expect(re.search(r"Train Epoch: 1 \[0/60000 \(0%\)\]\tLoss: \d+\.\d{6}", out),
               "the tutorial's loss line", out)
        last = re.search(r"Training time = [\d.]+ s \| [\d.]+ samples/s over 2 ranks \| test "
                         r"accuracy ([\d.]+)% \((\d+)/10000\)", out)
        expect(last, "final line with time, samples/s and accuracy", out)
        expect(float(last.group(1)) > 30.0, "30 steps of Adam should beat chance (10%)", out)
        print(f"mnist: OK ({last.group(0)})", flush=True)

        # Snapshot of the C++ CNN: resumable in C++, and loadable into the Python twin's CNN.
        # No evaluation after training (the run above checked it; the full test set costs each
        # rank ~4 s of CPU per run).
        mnist = [os.path.join(args.bin_dir, "mnist", "mnist"), "--max-steps", "5",
                 "--snapshot", "cnn.pt", "--loss-log", "steps.log", "--test-images", "0"]
        run(launch + ["--nproc-per-node", "2"] + mnist + ["--epochs", "1"], tmp)
        out = run(launch + ["--nproc-per-node", "2"] + mnist + ["--epochs", "2"], tmp)
        expect("Resuming from" in out and "at epoch 2" in out, "mnist resume line", out)
        expect("Train Epoch: 1 " not in out and "Train Epoch: 2 " in out,
               "resumed mnist must train epoch 2 only", out)
        # The resumed run counts on from the snapshot's steps (5 per epoch here), not from 0.
        with open(os.path.join(tmp, "steps.log")) as f:
            logged = [int(line.split()[0]) for line in f if line.strip()]
        expect(logged == list(range(1, 11)), "steps numbered 1-10 across the resume", str(logged))
        if subprocess.run([sys.executable, "-c", "import torch"]).returncode != 0:
            print(f"mnist snapshot: resumed in C++; Python twin check skipped: {sys.executable} "
                  "cannot import torch (run scripts/install-deps.sh)")
            return 0
        twin = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..",
                            "examples", "mnist", "mnist.py")
        # Plain torch.load: since torch 2.6 it unpickles with weights_only=True, which accepts
        # tensors, containers and numbers only; a snapshot must need nothing more.
        out = run([sys.executable, "-c", f"""
import importlib.util, torch
spec = importlib.util.spec_from_file_location("twin", {twin!r})
twin = importlib.util.module_from_spec(spec); spec.loader.exec_module(twin)
s = torch.load("cnn.pt")
model = twin.CNN(); model.load_state_dict(s["MODEL_STATE"])
print("python loaded epoch", s["EPOCHS_RUN"], sum(p.numel() for p in model.parameters()))
"""], tmp)
        expect("python loaded epoch 2 1199882" in out, "Python twin loads the C++ snapshot", out)
        print("mnist snapshot: OK (resumed in C++, loaded by the Python twin)", flush=True)
        return 0
    except (AssertionError, subprocess.TimeoutExpired) as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
