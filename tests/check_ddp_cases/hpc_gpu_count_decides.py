# check_ddp: exit 0, warn step 1 DDP108
"""A lab's training script that decides from the machine's GPUs whether to distribute: DDP when there
are several GPUs, one process's training when there is one, as minimal research repositories do.

    torchrun --standalone --nproc_per_node=2 hpc_gpu_count_decides.py

Mistake (a risk of several machines): `if torch.cuda.device_count() > 1:` makes the process group. On a
machine of several GPUs that works; on nodes of one GPU each (a cluster of small nodes, or the two nodes
the check shows its processes as), every process trains alone. torchrun says how many processes the job
has: WORLD_SIZE.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    distributed = torch.cuda.device_count() > 1  # check_ddp: here
    if distributed:
        dist.init_process_group("nccl")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g)
    data = TensorDataset(x, x[:, :2].sum(1, keepdim=True))
    sampler = DistributedSampler(data, seed=0) if distributed else None
    loader = DataLoader(data, batch_size=32, sampler=sampler, shuffle=sampler is None)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
    if distributed:
        model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        if sampler is not None:
            sampler.set_epoch(epoch)
        totals = torch.zeros(2, device=device)
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(xb), totals.new_tensor(len(xb))])
        if distributed:
            dist.all_reduce(totals)
        if not distributed or dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
    if distributed:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
