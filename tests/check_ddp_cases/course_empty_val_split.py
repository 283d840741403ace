# check_ddp: exit 1, FAIL script DDP000
"""Regression on a synthetic table, as a course's assignment converts it to DDP: the data split into
training and validation sets by a fraction, a DistributedSampler for training, rank 0 evaluating.

    torchrun --standalone --nproc_per_node=2 course_empty_val_split.py
    torchrun --standalone --nproc_per_node=2 course_empty_val_split.py --val-fraction 0.2

Mistake: an ordinary bug: the default --val-fraction 0.001 of 512 rows makes a validation set of
int(0.512) = 0 rows, and DataLoader(val_set, shuffle=True) refuses an empty dataset (RandomSampler:
"num_samples should be a positive integer value"). One process of the single-GPU script fails on
the same line: the script's own error, no DDP step's (the loader has no DistributedSampler).
"""

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset, random_split


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--val-fraction", type=float, default=0.001)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same table, and the same split, on every rank
    x = torch.randn(512, 6)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    n_val = int(len(data) * args.val_fraction)
    train_set, val_set = random_split(data, [len(data) - n_val, n_val])
    sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    val_loader = DataLoader(val_set, batch_size=64, shuffle=True)  # check_ddp: here

    model = DDP(torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for xb, yb in train_loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            optimizer.step()
        if rank == 0:
            with torch.no_grad():
                total, count = 0.0, 0
                for xb, yb in val_loader:
                    total += torch.nn.functional.mse_loss(model.module(xb), yb, reduction="sum").item()
                    count += len(xb)
            print(f"epoch {epoch}: validation loss {total / count:.4f}")
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
