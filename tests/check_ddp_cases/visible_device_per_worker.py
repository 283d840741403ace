# check_ddp: exit 1, FAIL step 8 DDP801
"""A research codebase's launcher, in the style of I-JEPA's main.py: one process per device named on
its command line (`python visible_device_per_worker.py cuda:0 cuda:1`), each of which narrows
CUDA_VISIBLE_DEVICES to its own GPU before it touches CUDA, and then uses cuda:0, which is that GPU.
The rendezvous address comes from the environment.

    torchrun --standalone --nproc_per_node=2 visible_device_per_worker.py

Mistake: it starts its own processes, under torchrun too (FAIL step 8). Its GPUs are right: each
worker's cuda:0 is the GPU it was given, so a run as its own launcher starts it puts rank 0 on the
node's GPU 0 and rank 1 on its GPU 1.
"""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

EPOCHS = 2


def build_data():
    g = torch.Generator().manual_seed(11)
    x = torch.randn(700, 5, generator=g)
    y = ((x**2).sum(1) > 5).long()
    return TensorDataset(x[:560], y[:560]), TensorDataset(x[560:], y[560:])


def worker(rank, world_size, devices):
    # each worker sees its own GPU only, before anything touches CUDA: cuda:0 is then that GPU
    os.environ["CUDA_VISIBLE_DEVICES"] = devices[rank].split(":")[-1]
    if torch.cuda.is_available():
        device = torch.device("cuda:0")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", init_method="env://", rank=rank, world_size=world_size
    )

    train_set, val_set = build_data()
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, seed=11)
    loader = DataLoader(train_set, batch_size=40, sampler=sampler)
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)), batch_size=70)

    torch.manual_seed(11)
    model = nn.Sequential(nn.Linear(5, 20), nn.ReLU(), nn.Linear(20, 2)).to(device)
    model = DDP(model, device_ids=[0] if device.type == "cuda" else None)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)

    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        model.train()
        acc = torch.zeros(4, device=device)  # train loss*n, train n, val correct, val n
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            acc[0] += loss.detach() * len(y)
            acc[1] += len(y)
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                acc[2] += (model.module(x).argmax(1) == y).sum()
                acc[3] += len(y)
        dist.all_reduce(acc)
        if rank == 0:
            print(
                f"[{epoch}] train loss {(acc[0] / acc[1]).item():.4f} val acc {(acc[2] / acc[3]).item():.3f}",
                flush=True,
            )
            torch.save(
                {"model": model.module.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, "model.pt"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    devices = sys.argv[1:] or ["cuda:0", "cuda:1"]
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(i, len(devices), devices)) for i in range(len(devices))]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    sys.exit(max(p.exitcode for p in procs))
