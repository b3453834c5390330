# An unmodified PyTorch script that hangs: every rank all-reduces once, then rank 1 sleeps in
# its own function (wait_forever, the line marked below) while the others wait in the next
# all_reduce. Run by the launcher tests under ddprun (--hang-timeout, `ddprun stacks`).
import time

import torch
import torch.distributed as dist


def wait_forever():
    time.sleep(600)  # HANG LINE: the report must name this line


def main():
    dist.init_process_group("gloo")
    t = torch.ones(4)
    dist.all_reduce(t)
    if dist.get_rank() == 1:
        wait_forever()
    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
