# check_ddp: exit 0, warn step 5 DDP505
"""A blog post's DDP example ("multi-GPU training in 5 minutes"): a few big steps per epoch, and the
loss of every step all-reduced so that rank 0 can print the global average as it goes. GPU only.

    torchrun --standalone --nproc_per_node=2 blog_metrics_every_step.py

Not quite right: an all-reduce and an .item() at every step, for logging: on a GPU each one waits for
the GPU to finish, every step. Sum on the device and all-reduce once an epoch.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

local_rank = int(os.environ["LOCAL_RANK"])
world_size = int(os.environ["WORLD_SIZE"])
dist.init_process_group("nccl")
torch.cuda.set_device(local_rank)
device = f"cuda:{local_rank}"

g = torch.Generator().manual_seed(11)
X = torch.randn(512, 16, generator=g)
Y = X @ torch.randn(16, 1, generator=g)
dataset = TensorDataset(X, Y)
sampler = DistributedSampler(dataset)
loader = DataLoader(dataset, batch_size=128, sampler=sampler)

torch.manual_seed(11)
model = DDP(nn.Linear(16, 1).to(device), device_ids=[local_rank])
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

for epoch in range(3):
    sampler.set_epoch(epoch)
    for step, (x, y) in enumerate(loader):
        x, y = x.to(device), y.to(device)
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        reduced = loss.detach().clone()
        dist.all_reduce(reduced)  # check_ddp: here
        if dist.get_rank() == 0:
            print(f"epoch {epoch} step {step}: loss {reduced.item() / world_size:.4f}")

if dist.get_rank() == 0:
    torch.save(
        {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
        "model.pt",
    )
dist.destroy_process_group()
