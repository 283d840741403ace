# check_ddp: exit 1, FAIL step 2 DDP201, FAIL step 4 DDP409
"""A fine-tuning script of the apex era, half converted: the GPU taken from the global rank, and DDP given
device_ids=[0], as the single-GPU version had it.

    torchrun --standalone --nproc_per_node=2 apex_device_ids_zero.py

Mistakes: torch.cuda.set_device(rank) uses the global rank, which a node of fewer GPUs than the job's
ranks lacks; and on a node of several GPUs, rank 1's model is on cuda:1 while DDP moves every batch to
device_ids[0], cuda:0: the first forward fails. Both come from the GPU not taken from LOCAL_RANK.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g)
    data = TensorDataset(x, x[:, :2].sum(1, keepdim=True))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).cuda()
    model = DDP(model, device_ids=[0])  # check_ddp: here
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        totals = torch.zeros(2).cuda()
        for xb, yb in loader:
            xb, yb = xb.cuda(), yb.cuda()
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(xb), totals.new_tensor(len(xb))])
        dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
