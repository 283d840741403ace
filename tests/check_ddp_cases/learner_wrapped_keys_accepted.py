# check_ddp: exit 0, ok step 6
"""A learner's own conversion that saves the DDP wrapper's state_dict() on purpose (their evaluation
script wraps the model in DDP before loading it), and says so on the save's line
(# check_ddp: ignore[DDP603]): the finding is counted as ignored, and step 6's line still says what the
file holds, the wrapper's module. prefix, never "no module. prefix".

    torchrun --standalone --nproc_per_node=2 learner_wrapped_keys_accepted.py
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    w = torch.randn(20, 3, generator=torch.Generator().manual_seed(123))
    y = (x @ w).argmax(dim=1)
    return TensorDataset(x, y)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 3))

    def forward(self, x):
        return self.net(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch_size", type=int, default=50)
    args = p.parse_args()

    torch.manual_seed(0)
    local_rank = int(os.environ["LOCAL_RANK"])  # DDP step 2
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", device_id=device.index)  # DDP step 1
    train_set, val_set = make_data(1000, seed=1), make_data(300, seed=2)
    sampler = DistributedSampler(train_set)  # DDP step 3
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    val_part = Subset(val_set, range(dist.get_rank(), len(val_set), dist.get_world_size()))  # DDP step 10
    val_loader = DataLoader(val_part, batch_size=args.batch_size)

    model = MLP().to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)  # DDP step 4
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # DDP step 3
        model.train()
        total, n = torch.zeros((), device=device), 0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total += loss.detach() * len(x)
            n += len(x)
        totals = torch.stack([total, total.new_tensor(n)])
        dist.all_reduce(totals)  # DDP step 5
        model.eval()
        vtotal, vn, correct = torch.zeros((), device=device), 0, torch.zeros((), device=device)
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                out = model.module(x)  # DDP step 10
                vtotal += F.cross_entropy(out, y, reduction="sum")
                correct += (out.argmax(1) == y).sum()
                vn += len(x)
        val_totals = torch.stack([vtotal, correct.to(vtotal.dtype), vtotal.new_tensor(vn)])
        dist.all_reduce(val_totals)  # DDP step 10
        if dist.get_rank() == 0:  # DDP step 6
            print(
                f"epoch {epoch}: train loss {(totals[0] / totals[1]).item():.4f}  "
                f"val loss {(val_totals[0] / val_totals[2]).item():.4f}  "
                f"val acc {(val_totals[1] / val_totals[2]).item():.3f}"
            )
            torch.save(  # check_ddp: ignore[DDP603]
                {"epoch": epoch, "model": model.state_dict(), "opt": opt.state_dict()}, "ckpt.pt"
            )
    dist.destroy_process_group()  # DDP step 7


if __name__ == "__main__":
    main()
