# check_ddp: exit 1, FAIL step 2 DDP201, FAIL step 3 DDP302, see step3_unseeded_dataset, gpu: FAIL step 3
"""A torchtitan-style script with two mistakes, one of which only a second node shows: its GPU is
torch.device("cuda", RANK), and its synthetic dataset is drawn with an unseeded generator. GPU only.

    torchrun --standalone --nproc_per_node=2 titan_global_rank_unseeded.py

Mistakes: (1) the global rank as the GPU index, which on the second node of a multi-node job asks for a
GPU that node does not have (rehearsed as two nodes of one GPU, the job stops there); (2) every rank
draws a different dataset, which a DistributedSampler then shards as if it were one. A check that stops
at the first must still find the second, on a layout where the job runs on (one node of two GPUs).
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def build_dataset(size):
    x = torch.randn(size, 8)  # unseeded: each rank draws its own
    return TensorDataset(x, (x[:, 0] > 0).long())


def main():
    # 1. init distributed
    dist.init_process_group("nccl")
    rank = int(os.environ["RANK"])
    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)  # check_ddp: here
    # 2. build the dataloader
    data = build_dataset(512)
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    # 3. build the model
    model = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2)).to(device), device_ids=[rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    # 4. train
    for epoch in range(2):
        sampler.set_epoch(epoch)
        totals = torch.zeros(2, device=device)
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(x), loss.new_tensor(len(x))])
        dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, "ckpt.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
