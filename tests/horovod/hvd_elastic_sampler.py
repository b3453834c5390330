"""hvd.elastic.ElasticSampler in a TorchState across a ddprun restart, mid-epoch.

    ddprun --standalone --nproc-per-node 2 --max-restarts 1 hvd_elastic_sampler.py

25 samples, batches of 2 per rank, shuffled. Epoch 0 runs whole; in epoch 1 the first attempt
commits after 2 batches, processes one more batch without committing, and rank 1 dies. After
the restart the workers must resume in epoch 1 with exactly the committed samples marked
processed, iterate only the others (each once, over both ranks, padded only to an equal count),
and finish epoch 2 whole. Every rank writes the samples it processed per attempt and epoch;
the last attempt checks them all.
"""

import json
import os
import sys

import torch

import horovod.torch as hvd

N, BATCH, EPOCHS, DIE_EPOCH, COMMITTED_BATCHES = 25, 2, 3, 1, 2


def main():
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    hvd.init()
    dataset = torch.utils.data.TensorDataset(torch.arange(N))
    sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=5)
    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    model = torch.nn.Linear(1, 1)
    state = hvd.elastic.TorchState(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                   sampler=sampler, epoch=0)
    log_dir = os.path.dirname(hvd.elastic.state.state_path())
    log = os.path.join(log_dir, f"sampler.{attempt}.{hvd.rank()}.json")
    seen = {}  # epoch -> the samples this rank processed in this attempt

    @hvd.elastic.run
    def train(state):
        if attempt == 1:
            committed = state.sampler.state_dict()
            if state.epoch != DIE_EPOCH or committed["epoch"] != DIE_EPOCH:
                raise SystemExit(f"rank {hvd.rank()}: resumed at epoch {state.epoch} (sampler "
                                 f"{committed['epoch']}), expected {DIE_EPOCH}")
            want = COMMITTED_BATCHES * BATCH * hvd.size()
            if len(committed["processed_indices"]) != want:
                raise SystemExit(f"rank {hvd.rank()}: {len(committed['processed_indices'])} "
                                 f"samples marked processed after the restart, expected {want}")
            left = N - want
            if len(state.sampler) != -(-left // hvd.size()):
                raise SystemExit(f"rank {hvd.rank()}: {len(state.sampler)} samples per rank "
                                 f"for the {left} left")
        while state.epoch < EPOCHS:
            for batch_idx, (x,) in enumerate(loader):
                seen.setdefault(state.epoch, []).extend(x.tolist())
                state.sampler.record_batch(batch_idx, BATCH)
                if attempt == 0 and state.epoch == DIE_EPOCH:
                    if batch_idx + 1 == COMMITTED_BATCHES:
                        state.commit()
                    elif batch_idx == COMMITTED_BATCHES:  # processed, never committed
                        with open(log, "w") as f:
                            json.dump(seen, f)
                        hvd.barrier()
                        if hvd.rank() == 1:
                            os._exit(3)
                        hvd.barrier()  # fails: rank 1 is gone; ddprun restarts both
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.commit()

    train(state)
    with open(log, "w") as f:
        json.dump(seen, f)
    hvd.barrier()
    if attempt != 1:
        raise SystemExit(f"finished in attempt {attempt}, expected attempt 1")
    if hvd.rank() == 0:
        logs = {}
        for a in (0, 1):
            for r in range(hvd.size()):
                with open(os.path.join(log_dir, f"sampler.{a}.{r}.json")) as f:
                    logs[a, r] = {int(e): v for e, v in json.load(f).items()}
        size = hvd.size()
        for epoch in range(EPOCHS):
            if epoch < DIE_EPOCH:
                runs = [logs[0, r].get(epoch, []) for r in range(size)]
            elif epoch == DIE_EPOCH:
                # The committed batches of attempt 0, then attempt 1's pass.
                committed = [logs[0, r][epoch][:COMMITTED_BATCHES * BATCH] for r in range(size)]
                runs = committed + [logs[1, r].get(epoch, []) for r in range(size)]
            else:
                runs = [logs[1, r].get(epoch, []) for r in range(size)]
            every = [i for run in runs for i in run]
            if sorted(set(every)) != list(range(N)):
                raise SystemExit(f"epoch {epoch}: samples {sorted(set(every))} processed, "
                                 f"expected all {N}")
            extra = len(every) - N
            if extra >= size:  # padding: fewer than one per rank
                raise SystemExit(f"epoch {epoch}: {extra} samples processed twice: {every}")
        print(f"hvd_elastic_sampler: resumed mid-epoch {DIE_EPOCH} with the committed samples "
              "skipped; every sample processed once per epoch", flush=True)
    hvd.shutdown()


if __name__ == "__main__":
    try:
        main()
    except SystemExit:
        raise
    except BaseException:
        import traceback

        traceback.print_exc()
        sys.stdout.flush()
        os._exit(1)
