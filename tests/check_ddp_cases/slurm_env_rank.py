# check_ddp: exit 1, FAIL step 8 DDP807
"""A university cluster's example, written for `srun python slurm_env_rank.py` in a SLURM batch script:
RANK, WORLD_SIZE and the GPU come from SLURM's own variables, MASTER_ADDR from the job's first node.
GPU only.

    srun --ntasks-per-node=2 python slurm_env_rank.py     # as its authors run it

Mistake, under torchrun: SLURM_PROCID is not set, and the script stops before it trains.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def setup():
    rank = int(os.environ["SLURM_PROCID"])  # check_ddp: here
    world_size = int(os.environ["SLURM_NTASKS"])
    local_rank = int(os.environ["SLURM_LOCALID"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    return rank, local_rank


def main():
    rank, local_rank = setup()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 4, generator=g)
    data = TensorDataset(x, x[:, :1])
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    model = DDP(nn.Linear(4, 1).cuda(local_rank), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb.cuda(local_rank)), yb.cuda(local_rank))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, "model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
