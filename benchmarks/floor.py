"""The start-up floor of a DDP job: processes that only join the process group and
all-reduce one tensor. benchmarks/benchmark.py times torchrun launching this beside
train_ddp.py, so that "time to first result" is measured against what torchrun costs."""

import torch
import torch.distributed as dist

use_cuda = torch.cuda.is_available()
dist.init_process_group("nccl" if use_cuda else "gloo")
one = torch.ones(1, device="cuda" if use_cuda else "cpu")
dist.all_reduce(one)
dist.destroy_process_group()
