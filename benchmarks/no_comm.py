"""Run a training script with DDP's gradient all-reduce skipped, to measure what it costs.

    torchrun ... benchmarks/no_comm.py train_ddp.py [flags]

Every DDP model gets torch's noop_hook as its communication hook: each gradient bucket
is handed back as it is, a completed future, without being all-reduced. DDP still runs
its hooks and buckets, so the difference from a normal run is the communication alone
(and the waiting for the slowest rank that comes with it). The ranks no longer agree on
their gradients, so the training is wrong: this is for timing only (torch's own words:
"headroom analysis of allreduce optimization"). The scripts' other collectives (the
metrics, once per epoch) are untouched."""

import runpy
import sys

from torch.distributed.algorithms.ddp_comm_hooks.debugging_hooks import noop_hook
from torch.nn.parallel import DistributedDataParallel

ddp_init = DistributedDataParallel.__init__


def init_without_allreduce(self, *args, **kwargs):
    ddp_init(self, *args, **kwargs)
    self.register_comm_hook(None, noop_hook)


DistributedDataParallel.__init__ = init_without_allreduce
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
