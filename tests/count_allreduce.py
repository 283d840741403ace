"""Run a training script and report at exit how many gradient all-reduces DDP made on each rank.

    torchrun ... tests/count_allreduce.py train_ddp.py [flags]

A DDP communication hook counts the buckets it is handed, then all-reduces them as
DDP's default does, so the training itself is unchanged."""

import atexit
import os
import runpy
import sys

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

calls = 0
ddp_init = DistributedDataParallel.__init__


def counting_hook(process_group, bucket):
    global calls
    calls += 1
    return allreduce_hook(process_group, bucket)


def init_with_counter(self, *args, **kwargs):
    ddp_init(self, *args, **kwargs)
    self.register_comm_hook(dist.group.WORLD, counting_hook)


DistributedDataParallel.__init__ = init_with_counter
atexit.register(lambda: sys.stderr.write(f"ALLREDUCES rank={os.environ.get('RANK')} calls={calls}\n"))
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
