# check_ddp: exit 0, warn step 5 DDP506
"""A flat regression script of the timm/references kind: an AverageMeter for the training loss
and mean absolute error, and a metrics.json history that rank 0 rewrites after each epoch.

    torchrun --standalone --nproc_per_node=2 a2_meter_to_json.py

Mistake: the AverageMeter objects `losses` and `maes` are updated per batch on each rank and
never synchronised; rank 0 writes losses.avg and maes.avg to metrics.json as "train_loss" and
"train_mae", i.e. the mean over its own shard of the data only. The validation sums beside them
ARE all-reduced, so the file mixes a job-wide number with a one-shard estimate: a warn of step 5.
"""

import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class AverageMeter:
    """Computes and stores the average and current value"""

    def __init__(self, name):
        self.name = name
        self.reset()

    def reset(self):
        self.val = 0.0
        self.sum = 0.0
        self.count = 0
        self.avg = 0.0

    def update(self, val, n=1):
        self.val = val
        self.sum += val * n
        self.count += n
        self.avg = self.sum / self.count


EPOCHS = 3
BATCH = 40
SEED = 7

local_rank = int(os.environ["LOCAL_RANK"])
use_cuda = torch.cuda.is_available()
device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
if use_cuda:
    torch.cuda.set_device(device)
dist.init_process_group(backend="nccl" if use_cuda else "gloo")
rank = dist.get_rank()
world_size = dist.get_world_size()

gen = torch.Generator().manual_seed(SEED)
true_w = torch.randn(8, 1, generator=gen)
x_all = torch.randn(1400, 8, generator=gen)
y_all = x_all @ true_w + 0.3 * torch.randn(1400, 1, generator=gen)
train_ds = TensorDataset(x_all[:1000], y_all[:1000])
val_ds = TensorDataset(x_all[1000:], y_all[1000:])

train_sampler = DistributedSampler(train_ds, shuffle=True, seed=SEED)
train_loader = DataLoader(train_ds, batch_size=BATCH, sampler=train_sampler)
val_loader = DataLoader(Subset(val_ds, range(rank, len(val_ds), world_size)), batch_size=100)

torch.manual_seed(SEED)
net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 1)).to(device)
net = DDP(net, device_ids=[local_rank] if use_cuda else None)
optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
criterion = nn.MSELoss()

history = []
for epoch in range(EPOCHS):
    train_sampler.set_epoch(epoch)
    net.train()
    losses = AverageMeter("loss")
    maes = AverageMeter("mae")
    for xb, yb in train_loader:
        xb, yb = xb.to(device), yb.to(device)
        pred = net(xb)
        loss = criterion(pred, yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.update(loss.item(), xb.size(0))
        maes.update((pred.detach() - yb).abs().mean().item(), xb.size(0))

    net.eval()
    val_stats = torch.zeros(2, device=device)
    with torch.no_grad():
        for xb, yb in val_loader:
            xb, yb = xb.to(device), yb.to(device)
            val_stats[0] += nn.functional.mse_loss(net.module(xb), yb, reduction="sum")
            val_stats[1] += xb.size(0)
    dist.all_reduce(val_stats, op=dist.ReduceOp.SUM)

    if rank == 0:
        history.append(
            {
                "epoch": epoch,
                "train_loss": losses.avg,
                "train_mae": maes.avg,
                "val_loss": (val_stats[0] / val_stats[1]).item(),
            }
        )
        with open("metrics.json", "w") as f:
            json.dump(history, f, indent=2)
        print(json.dumps(history[-1]))
        torch.save({"model": net.module.state_dict(), "optimizer": optimizer.state_dict()}, "a2_last.pt")

dist.destroy_process_group()
