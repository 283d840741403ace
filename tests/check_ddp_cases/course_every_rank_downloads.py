# check_ddp: exit 1, FAIL step 3 DDP309
"""A course's DDP exercise built on a torchvision-style dataset class: `Digits(root, download=True)` fetches
its files when they are missing, made on every rank at the start.

    torchrun --standalone --nproc_per_node=2 course_every_rank_downloads.py

Mistake: every rank downloads into one folder at once (here the data is made in memory, as a stand-in for
the download; on a cluster each rank would write the same archive). Download on rank 0 alone, barrier, then
let every rank read it.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class Digits(Dataset):
    """torchvision's dataset interface: a root folder, and download= for files that are missing."""

    def __init__(self, root, train=True, download=False):
        self.root = root
        if download:
            self.fetch()
        g = torch.Generator().manual_seed(0 if train else 1)
        self.x = torch.randn(512 if train else 128, 8, generator=g)
        self.y = self.x[:, :2].sum(1, keepdim=True)

    def fetch(self):
        pass  # the stand-in's data is made in memory: nothing to fetch

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    train_set = Digits("data", train=True, download=True)  # check_ddp: here
    sampler = DistributedSampler(train_set, seed=0)
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1).to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        totals = torch.zeros(2, device=device)
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(xb), totals.new_tensor(len(xb))])
        dist.all_reduce(totals)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
