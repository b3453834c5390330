"""hvd.elastic.run with TorchState on ddprun's restarts.

    ddprun --standalone --nproc-per-node 2 --max-restarts 1 hvd_elastic.py

Trains 6 epochs, committing after each. In the first attempt rank 1 dies right after the
commit of epoch 3; ddprun restarts both workers, which must resume at epoch 3 with the committed
parameters (checked against a digest the first attempt wrote beside the state) and with the
reset callback called, then finish. The final parameters must equal those of an uninterrupted
run computed in the last attempt from scratch (the training is deterministic).
"""

import os
import sys

import torch

import horovod.torch as hvd

EPOCHS, DIE_AFTER = 6, 3


def make():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.5)


def epoch_step(model, opt, epoch):
    g = torch.Generator().manual_seed(100 * epoch + hvd.rank())
    x = torch.randn(8, 4, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
    opt.step()


def flat(model):
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def main():
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    hvd.init()
    model, base_opt = make()
    opt = hvd.DistributedOptimizer(base_opt, named_parameters=model.named_parameters())
    state = hvd.elastic.TorchState(model, opt, epoch=0)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(state.epoch)])
    digest_file = os.path.join(os.path.dirname(hvd.elastic.state.state_path()), "digest.pt")

    @hvd.elastic.run
    def train(state):
        if attempt == 1:
            if state.epoch != DIE_AFTER:
                raise SystemExit(f"rank {hvd.rank()}: resumed at epoch {state.epoch}, "
                                 f"expected {DIE_AFTER}")
            if resets != [DIE_AFTER]:
                raise SystemExit(f"rank {hvd.rank()}: reset callbacks saw {resets}")
            if not torch.equal(flat(state.model), torch.load(digest_file)):
                raise SystemExit(f"rank {hvd.rank()}: parameters after the restart are not the "
                                 "committed ones")
        while state.epoch < EPOCHS:
            epoch_step(state.model, state.optimizer, state.epoch)
            state.epoch += 1
            state.commit()
            if attempt == 0 and state.epoch == DIE_AFTER:
                if hvd.rank() == 0:
                    torch.save(flat(state.model), digest_file)
                hvd.barrier()
                if hvd.rank() == 1:
                    print("hvd_elastic: rank 1 exits after the commit of epoch "
                          f"{DIE_AFTER}", flush=True)
                    os._exit(3)
                hvd.barrier()  # fails: rank 1 is gone; ddprun restarts both
        return flat(state.model)

    resumed = train(state)
    if attempt != 1:
        raise SystemExit(f"finished in attempt {attempt}, expected attempt 1")
    # The same training without the interruption, in this process, on a fresh group-free copy.
    model2, opt2 = make()
    opt2 = hvd.DistributedOptimizer(opt2, named_parameters=model2.named_parameters())
    for epoch in range(EPOCHS):
        epoch_step(model2, opt2, epoch)
    if not torch.allclose(resumed, flat(model2), atol=1e-6):
        raise SystemExit(f"rank {hvd.rank()}: resumed run ended at {resumed.tolist()}, the "
                         f"uninterrupted one at {flat(model2).tolist()}")
    hvd.shutdown()
    if attempt == 1 and resumed is not None:
        print(f"hvd_elastic: rank {os.environ['RANK']} resumed at epoch {DIE_AFTER} and matched "
              "the uninterrupted run", flush=True)


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
