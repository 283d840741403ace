# check_ddp: exit 1, FAIL step 8 DDP801
"""A self-launching script from before torchrun: __main__ builds a list of mp.Process workers,
one per device, starts and joins them; the rendezvous address comes from the environment, as its
README says (`MASTER_ADDR=127.0.0.1 MASTER_PORT=29533 python e2_mp_process_workers.py`).

    torchrun --standalone --nproc_per_node=2 e2_mp_process_workers.py

Mistake: __main__ starts its own N worker processes whether or not a launcher already did. Under
torchrun every one of its 2 processes starts 2 workers (4 in all), each calling
init_process_group(rank=i, world_size=2) on torchrun's MASTER_ADDR/MASTER_PORT: duplicate ranks on
one rendezvous. Which peer each connects to is a race: on a CPU the run either hangs, or completes
as two copies of the job (every line printed twice, two "rank 0"s writing e2_model.pt), and on a GPU
node two workers would share each GPU. The script is launched twice over: FAIL step 8; the DDP
inside worker() is the README's form."""

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


def worker(rank, world_size):
    # MASTER_ADDR / MASTER_PORT come from the environment (env:// rendezvous)
    if torch.cuda.is_available():
        device = torch.device("cuda", rank)
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
    model = DDP(model, device_ids=[rank] if device.type == "cuda" else None)
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
                {"model": model.module.state_dict(), "opt": opt.state_dict(), "epoch": epoch}, "e2_model.pt"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    nprocs = torch.cuda.device_count() or 2
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=worker, args=(i, nprocs)) for i in range(nprocs)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    sys.exit(max(p.exitcode for p in procs))
