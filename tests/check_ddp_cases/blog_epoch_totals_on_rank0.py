# check_ddp: exit 1, FAIL step 6 DDP609, see step6_collective_on_rank_zero
"""A blog post's CPU example of "logging the loss properly": each rank sums its loss and its samples
over the epoch, and the sums are all-reduced, but inside the block that only rank 0 runs, next to the
print. CPU code (gloo).

    torchrun --standalone --nproc_per_node=2 blog_epoch_totals_on_rank0.py

Mistake: dist.all_reduce() inside `if rank == 0:`. Rank 0's all-reduce meets whatever collective the
other ranks call next (here DDP's first gradient all-reduce of the next epoch): the job hangs, fails on
mismatched sizes, or, when the sizes happen to agree, goes on with numbers that mean nothing. Each
rank's sequence of collectives, compared, shows it on every run, whichever of these happens.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(384, 6, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        totals = torch.zeros(2)
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(xb), torch.tensor(float(len(xb)))])
        if rank == 0:
            dist.all_reduce(totals)  # check_ddp: here
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
