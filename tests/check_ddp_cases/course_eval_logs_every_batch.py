# check_ddp: exit 1, FAIL step 5 DDP508, see step6_collective_on_rank_zero
"""A course's evaluation loop that logs a running held-out loss after every batch, all-reduced so that
every rank prints the same: each rank evaluates every world_size-th held-out sample from its rank on,
in batches. CPU code (gloo).

    torchrun --standalone --nproc_per_node=2 course_eval_logs_every_batch.py

Mistake: the held-out set (101 samples) does not split evenly, so rank 0 has one batch more than rank 1,
and its all-reduce of that batch meets nothing of rank 1's but whatever rank 1 calls next: the ranks'
collectives part there. (No `if rank == 0:` in sight: the branch is the loop's own length.) Reduce once,
after the loop, a (sum, count) every rank has.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(357, 4, generator=g)
    y = x @ torch.tensor([[0.5], [-1.0], [2.0], [0.0]])
    train = TensorDataset(x[:256], y[:256])
    x_val, y_val = x[256:], y[256:]
    sampler = DistributedSampler(train, seed=0)
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in DataLoader(train, batch_size=32, sampler=sampler):
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        mine = torch.arange(rank, len(x_val), world)
        running = torch.zeros(2)
        with torch.no_grad():
            for batch in mine.split(10):
                err = nn.functional.mse_loss(model.module(x_val[batch]), y_val[batch], reduction="sum")
                step = torch.stack([err, torch.tensor(float(len(batch)))])
                dist.all_reduce(step)  # check_ddp: here
                running += step
        if rank == 0:
            print(f"epoch {epoch}: held-out mse {(running[0] / running[1]).item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
