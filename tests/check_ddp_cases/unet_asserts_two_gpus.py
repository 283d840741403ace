# check_ddp: exit 1, FAIL step 8 DDP000
"""A course project's distributed U-Net training: the world size is the number of GPUs this machine has,
and the script refuses to start with fewer than two. GPU only.

    torchrun --standalone --nproc_per_node=2 unet_asserts_two_gpus.py

Mistake: torch.cuda.device_count() counts one node's GPUs, not the job's processes: on two nodes of one
GPU each (or any node of one), the script refuses a job that is fine, and on several nodes its
learning-rate scaling uses the wrong world size.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

WORLD_SIZE = torch.cuda.device_count()


def train(lr=1e-3):
    assert WORLD_SIZE >= 2, f"Requires at least 2 GPUs to run, but got {WORLD_SIZE}"  # check_ddp: here
    rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl")
    g = torch.Generator().manual_seed(2)
    data = TensorDataset(torch.rand(128, 1, 8, 8, generator=g), torch.rand(128, 1, 8, 8, generator=g).round())
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    model = DDP(nn.Conv2d(1, 1, 3, padding=1).cuda(rank), device_ids=[rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=lr * WORLD_SIZE)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.binary_cross_entropy_with_logits(model(x.cuda(rank)), y.cuda(rank))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    train()
