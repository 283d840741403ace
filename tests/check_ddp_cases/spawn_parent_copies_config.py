# check_ddp: exit 1, FAIL step 8 DDP801
"""A vocoder-style script, as many GAN and speech repositories are: main() copies its config into the
run's folder and writes the run's settings, then starts one process a GPU with
torch.multiprocessing.spawn; each child meets the others, trains, and rank 0 saves.

    python spawn_parent_copies_config.py        # as its authors run it: one parent, one child a GPU

Mistake, under torchrun: each of torchrun's processes is already one of the job's, and spawns a job of
its own (step 8). As its authors run it, main() runs once a node, so the config is written once: the
copies torchrun's extra processes make are the launch's doing, not a second mistake of the script's.
"""

import json
import os
import shutil
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

CONFIG = {"hidden": 32, "lr": 0.02, "epochs": 3, "batch_size": 32}


def train(rank, world_size, run_dir):
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    device = torch.device("cuda", rank)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g)
    dataset = TensorDataset(x, x.sum(dim=1, keepdim=True))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=CONFIG["batch_size"], sampler=sampler)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, CONFIG["hidden"]), nn.ReLU(), nn.Linear(CONFIG["hidden"], 1))
    model = DDP(model.to(device), device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=CONFIG["lr"])
    for epoch in range(CONFIG["epochs"]):
        sampler.set_epoch(epoch)
        totals = torch.zeros(2, device=device)
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(xb), torch.tensor(float(len(xb)), device=device)])
        dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
    if rank == 0:
        checkpoint = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
        torch.save(checkpoint, os.path.join(run_dir, "checkpoint.pt"))
    dist.destroy_process_group()


def main():
    run_dir = "run"
    os.makedirs(run_dir, exist_ok=True)
    with open("config.json", "w") as f:
        json.dump(CONFIG, f)
    shutil.copyfile("config.json", os.path.join(run_dir, "config.json"))  # the run keeps its config
    with open(os.path.join(run_dir, "args.txt"), "w") as f:
        f.write(" ".join(sys.argv))
    world_size = torch.cuda.device_count()
    mp.spawn(train, nprocs=world_size, args=(world_size, run_dir))


if __name__ == "__main__":
    main()
