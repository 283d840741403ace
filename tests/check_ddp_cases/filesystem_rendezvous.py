# check_ddp: exit 1, FAIL step 8 DDP806
"""A cluster tutorial's script that meets its peers through a shared folder before it makes its process
group (as `init_method="file://..."` does): each process leaves a file named after its rank, and waits
until the job's processes have all left theirs. The job's size is the script's own setting: the GPUs of
the machine it was written for. GPU only.

    torchrun --standalone --nproc_per_node=4 filesystem_rendezvous.py     # as its author runs it

Mistake: the script waits for its own idea of the job (4 processes), not torchrun's (WORLD_SIZE): on 2,
every process waits forever, before any process group is made.
"""

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def wait_for_peers(folder, rank, world_size):
    folder.mkdir(exist_ok=True)
    (folder / f"rank{rank}.ready").touch()
    while len(list(folder.glob("rank*.ready"))) < world_size:
        time.sleep(0.2)  # check_ddp: here


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpus", type=int, default=4, help="GPUs in the job (default: 4)")
    args = parser.parse_args()
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    wait_for_peers(Path("rendezvous"), rank, args.gpus)
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    model = DDP(nn.Linear(4, 1).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(4):
        x = torch.randn(8, 4, device="cuda")
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
