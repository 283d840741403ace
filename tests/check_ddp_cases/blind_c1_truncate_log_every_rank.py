# check_ddp: exit 0
"""A flat training script that keeps a plain-text train.log beside it, the way many research
scripts do: the file is cleared when the job starts, then one line is appended per epoch.

    torchrun --standalone --nproc_per_node=2 c1_truncate_log_every_rank.py

Correct: every rank runs `open(LOG_PATH, "w").close()` at start, before the process group
exists, so the file is created or emptied N times over, but no rank ever writes content
there except rank 0, whose `log()` appends its lines only after the first epoch's all-reduces,
i.e. after every rank has passed its truncation. One writer of content, nothing lost or
interleaved: not the "every rank writes the same file" mistake of step 6, and exit 0.
"""

import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

LOG_PATH = "train.log"
EPOCHS = 3
BATCH_SIZE = 25
LR = 0.1

open(LOG_PATH, "w").close()  # start a fresh log (every rank runs this line)

local_rank = int(os.environ["LOCAL_RANK"])
if torch.cuda.is_available():
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    backend = "nccl"
else:
    device = torch.device("cpu")
    backend = "gloo"
dist.init_process_group(backend)
rank, world_size = dist.get_rank(), dist.get_world_size()


def log(msg):
    if rank == 0:
        print(msg)
        with open(LOG_PATH, "a") as f:
            f.write(f"{time.strftime('%H:%M:%S')} {msg}\n")


g = torch.Generator().manual_seed(42)
X = torch.randn(900, 10, generator=g)
Y = (X[:, :5].sum(1) > X[:, 5:].sum(1)).long()
train_set = TensorDataset(X[:700], Y[:700])
val_set = TensorDataset(X[700:], Y[700:])

sampler = DistributedSampler(train_set, shuffle=True, seed=42)
loader = DataLoader(train_set, batch_size=BATCH_SIZE, sampler=sampler)
val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)), batch_size=BATCH_SIZE)

torch.manual_seed(42)
model = nn.Sequential(nn.Linear(10, 24), nn.ReLU(), nn.Linear(24, 2)).to(device)
model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
opt = torch.optim.SGD(model.parameters(), lr=LR)
loss_fn = nn.CrossEntropyLoss()

for epoch in range(EPOCHS):
    sampler.set_epoch(epoch)
    model.train()
    tot = torch.zeros(2, device=device)
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        opt.zero_grad()
        loss = loss_fn(model(xb), yb)
        loss.backward()
        opt.step()
        tot[0] += loss.detach() * xb.shape[0]
        tot[1] += xb.shape[0]
    dist.all_reduce(tot)

    model.eval()
    val = torch.zeros(2, device=device)
    with torch.no_grad():
        for xb, yb in val_loader:
            xb, yb = xb.to(device), yb.to(device)
            val[0] += (model.module(xb).argmax(1) == yb).sum()
            val[1] += xb.shape[0]
    dist.all_reduce(val)
    log(f"epoch={epoch} train_loss={(tot[0] / tot[1]).item():.4f} val_acc={(val[0] / val[1]).item():.3f}")

if rank == 0:
    torch.save(model.module.state_dict(), "c1_model.pt")
    log("saved c1_model.pt")
dist.destroy_process_group()
