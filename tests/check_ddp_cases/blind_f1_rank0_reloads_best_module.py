# check_ddp: exit 0
"""A classification script with early-stopping-style checkpointing, as a Kaggle-notebook-turned-
script often is: validate every epoch, keep `best.pt` when the (all-reduced) validation loss
improves, and at the end report the best model's score on a held-out test set.

    torchrun --standalone --nproc_per_node=2 f1_rank0_reloads_best_module.py

Correct: after training, `if rank == 0:` reloads best.pt into model.module (the plain model
inside the wrapper, whose forward is no collective) and scores the whole test set on its own;
the other ranks skip it and go straight to destroy_process_group(). Nothing inside the rank-0
block talks to the other ranks, and no rank trains after it, so the replicas may differ there
without harm: a final, rank-0-only test is slower than a sharded one but is not a DDP mistake.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

BEST = "f1_best.pt"


def tabular(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    logits = x[:, :4] @ torch.tensor([1.0, -2.0, 0.5, 1.5]) + 0.5 * x[:, 4] * x[:, 5]
    return TensorDataset(x, (logits > 0).long())


def evaluate_shard(model, loader, device):
    model.eval()
    s = torch.zeros(3, device=device)
    with torch.no_grad():
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            out = model(x)
            s += torch.stack(
                [
                    F.cross_entropy(out, y, reduction="sum"),
                    (out.argmax(1) == y).sum().float(),
                    s.new_tensor(len(y)),
                ]
            )
    return s


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    train_set, val_set, test_set = tabular(1000, 0), tabular(200, 1), tabular(300, 2)
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    train_loader = DataLoader(train_set, batch_size=50, sampler=sampler)
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world)), batch_size=100)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.1), nn.Linear(32, 2)).to(device)
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)

    best_val = float("inf")
    for epoch in range(3):
        sampler.set_epoch(epoch)
        model.train()
        t = torch.zeros(2, device=device)
        for x, y in train_loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            t += torch.stack([loss.detach() * len(y), t.new_tensor(len(y))])
        v = evaluate_shard(model.module, val_loader, device)
        both = torch.cat([t, v])
        dist.all_reduce(both)
        train_loss, val_loss, val_acc = (
            (both[0] / both[1]).item(),
            (both[2] / both[4]).item(),
            (both[3] / both[4]).item(),
        )
        if rank == 0:
            print(f"epoch {epoch}: train {train_loss:.4f} val {val_loss:.4f} acc {val_acc:.3f}")
        if val_loss < best_val:  # the same decision on every rank: val_loss is all-reduced
            best_val = val_loss
            if rank == 0:
                torch.save(model.module.state_dict(), BEST)

    # final test of the best weights, on rank 0 alone
    if rank == 0:
        model.module.load_state_dict(torch.load(BEST, map_location=device))
        test_loader = DataLoader(test_set, batch_size=100)
        s = evaluate_shard(model.module, test_loader, device)  # no all_reduce: the whole test set is here
        print(f"test (best epoch weights): loss {(s[0] / s[2]).item():.4f} acc {(s[1] / s[2]).item():.3f}")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
