"""The start-up floor of a DDP job: processes that only join the process group and
all-reduce one tensor. benchmarks/benchmark.py times torchrun launching this beside
train_ddp.py, so that "time to first result" is measured against what torchrun costs.

    torchrun --standalone --nproc_per_node=2 benchmarks/floor.py [--device cpu]

Each process is placed as train_ddp.py places it: on the GPU LOCAL_RANK names, set
before the group is created and bound to it, so that N processes use N GPUs."""

import argparse
import os

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="(default: auto)")
args = parser.parse_args()
use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())

if use_cuda:
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
else:
    device = torch.device("cpu")
    dist.init_process_group("gloo")
one = torch.ones(1, device=device)
dist.all_reduce(one)
dist.destroy_process_group()
