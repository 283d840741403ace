# check_ddp: exit 0, ok step 10
"""A course assignment's solution (train.py of a "distributed training" homework): train with a
DistributedSampler, then evaluate on the validation split and print the accuracy from rank 0. GPU only.

    torchrun --standalone --nproc_per_node=2 course_evaluates_all_accepted.py

Accepted on purpose: the validation loader has no DistributedSampler, so every rank evaluates the whole
validation set: the number is exact, at N times the work, which the course accepts for a small set and
says so where the loader is made (# check_ddp: ignore[DDP1005]): the report counts the finding as ignored.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, random_split
from torch.utils.data.distributed import DistributedSampler


def get_loaders(batch_size=32):
    g = torch.Generator().manual_seed(2024)
    x = torch.randn(1200, 20, generator=g)
    y = (x[:, 0] + x[:, 1] > 0).long()
    train_set, val_set = random_split(
        TensorDataset(x, y), [1000, 200], generator=torch.Generator().manual_seed(0)
    )
    train_loader = DataLoader(train_set, batch_size=batch_size, sampler=DistributedSampler(train_set))
    val_loader = DataLoader(val_set, batch_size=100, shuffle=False)  # check_ddp: ignore[DDP1005]
    return train_loader, val_loader


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    correct = total = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        correct += (model(x).argmax(1) == y).sum()
        total += len(y)
    return correct / total


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}")
    torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl")
    train_loader, val_loader = get_loaders()
    torch.manual_seed(0)
    model = DDP(
        nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 2)).to(device),
        device_ids=[local_rank],
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        train_loader.sampler.set_epoch(epoch)
        model.train()
        totals = torch.zeros(2, device=device)
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(y), torch.tensor(float(len(y)), device=device)])
        dist.all_reduce(totals)
        accuracy = evaluate(model.module, val_loader, device)
        if dist.get_rank() == 0:
            print(
                f"epoch {epoch}: train loss {(totals[0] / totals[1]).item():.3f}, "
                f"val acc {accuracy.item():.3f}"
            )
    if dist.get_rank() == 0:
        torch.save(
            {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
            "hw3_model.pt",
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
