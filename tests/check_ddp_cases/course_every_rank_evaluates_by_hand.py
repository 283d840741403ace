# check_ddp: exit 0, warn step 10 DDP1005
"""A learner's conversion of a single-GPU script that evaluates the whole held-out set by hand (index
batches over range(len(val_set)), no DataLoader), unchanged: every rank still evaluates all of it.
CPU-aware, as the course's scripts are: a GPU where there is one.

    torchrun --standalone --nproc_per_node=2 course_every_rank_evaluates_by_hand.py

Not quite right, and not wrong: each rank's held-out number is the whole set's, exact; the cost is N
times the work. (A checker must not call it "each rank's own batches": they are the same batches.)
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, TensorDataset


def main():
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    g = torch.Generator().manual_seed(3)
    x = torch.randn(700, 5, generator=g)
    y = x @ torch.randn(5, 1, generator=g)
    train_set, val_set = TensorDataset(x[:600], y[:600]), TensorDataset(x[600:], y[600:])
    sampler = DistributedSampler(train_set, seed=3)
    loader = DataLoader(train_set, batch_size=25, sampler=sampler)
    torch.manual_seed(3)
    model = DDP(nn.Linear(5, 1).to(device), device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        train_sum, seen = torch.zeros((), device=device), 0
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb.to(device)), yb.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            train_sum += loss.detach() * len(xb)
            seen += len(xb)
        totals = torch.stack([train_sum, train_sum.new_tensor(seen)])
        dist.all_reduce(totals)
        model.eval()
        val_sum, val_seen = torch.zeros((), device=device), 0
        with torch.no_grad():
            for indices in BatchSampler(range(len(val_set)), 32, drop_last=False):
                xb, yb = (t.to(device) for t in val_set[indices])
                val_sum += nn.functional.mse_loss(model.module(xb), yb, reduction="sum")
                val_seen += len(xb)
        model.train()
        if dist.get_rank() == 0:
            train_loss, held_out = (totals[0] / totals[1]).item(), (val_sum / val_seen).item()
            print(f"epoch {epoch}: train {train_loss:.4f} held-out {held_out:.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
