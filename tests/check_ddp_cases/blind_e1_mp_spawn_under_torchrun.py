# check_ddp: exit 1, FAIL step 8 DDP801
"""The PyTorch-tutorial shape of a DDP script: a worker function `train(rank, world_size)` and
`mp.spawn(train, nprocs=world_size)` in __main__, one process per GPU (two on a CPU). Its
author later started it with torchrun, as the cluster's docs say, without removing the spawn.

    torchrun --standalone --nproc_per_node=2 e1_mp_spawn_under_torchrun.py

Mistake: __main__ always calls mp.spawn, also under torchrun, which has already started one process
per GPU: each of torchrun's 2 processes spawns 2 more, 4 workers that all claim ranks 0 and 1 of a
world of 2 on torchrun's own rendezvous (MASTER_ADDR/MASTER_PORT are only filled in with setdefault
when absent, so torchrun's are used). Two ranks 0 and two ranks 1 meet on one store and connect to
whichever peer registered last: on a CPU the run may hang, die at the wrap, or complete as two
copies of the job (each line printed twice, two "rank 0"s writing e1_checkpoint.pt); on GPUs each
device is taken twice. The launch is the cause: FAIL step 8 (the script should either spawn or be
launched by torchrun, reading RANK/LOCAL_RANK, never both)."""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def setup(rank, world_size):
    os.environ.setdefault("MASTER_ADDR", "localhost")  # keep a launcher's values if it set them
    os.environ.setdefault("MASTER_PORT", "12355")
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world_size)


def cleanup():
    dist.destroy_process_group()


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def toy_data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 10, generator=g)
    return TensorDataset(x, x[:, :5] * 0.5 - x[:, 5:])


def train(rank, world_size, epochs=3):
    setup(rank, world_size)
    if torch.cuda.is_available():
        device = torch.device("cuda", rank)  # one node: the spawn index is the GPU
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    dataset, val_set = toy_data(600, seed=0), toy_data(101, seed=1)
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=30, sampler=sampler)
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)), batch_size=64)

    torch.manual_seed(0)
    model = ToyModel().to(device)
    ddp_model = DDP(model, device_ids=[rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.01)

    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        sums = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.mse_loss(ddp_model(x), y)
            loss.backward()
            optimizer.step()
            sums += torch.stack([loss.detach() * len(x), sums.new_tensor(len(x))])
        val = torch.zeros(2, device=device)
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                per_sample = F.mse_loss(model(x), y, reduction="none").mean(1)
                val += torch.stack([per_sample.sum(), val.new_tensor(len(x))])
        both = torch.cat([sums, val])
        dist.all_reduce(both)
        if rank == 0:
            print(
                f"epoch {epoch}: train {(both[0] / both[1]).item():.4f}  val {(both[2] / both[3]).item():.4f}"
            )
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                "e1_checkpoint.pt",
            )
    cleanup()


def run_demo(demo_fn, world_size):
    mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)


if __name__ == "__main__":
    n_gpus = torch.cuda.device_count()
    world_size = n_gpus if n_gpus > 0 else 2
    run_demo(train, world_size)
