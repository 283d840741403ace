# check_ddp: exit 1, warn step 3 DDP308, FAIL step 6 DDP602
"""A Lightning-inspired plain-PyTorch script: a DataModule whose prepare_data() runs on each
node's LOCAL_RANK 0 only (writing .npy arrays under ./data), setup() that every rank runs after a
barrier, and a fit() function with a per-epoch checkpoint.

    torchrun --standalone --nproc_per_node=2 g2_datamodule_prepare_every_rank_saves.py

Mistakes: (1) a warn of step 3: the dataset is written once per node (`if local_rank == 0`), so
on two nodes sharing a disk both nodes' local rank 0 write data/*.npy at once. (2) a FAIL of
step 6, unrelated: fit() calls save_checkpoint() on every rank, with no rank check, so all
ranks torch.save the same g2_last.pt at the same moment: N writers of one file, which can
leave it truncated or mixed. A 2-process run shows both writes.
"""

import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class SyntheticDataModule:
    def __init__(self, root="data", batch_size=32, seed=2024):
        self.root = root
        self.batch_size = batch_size
        self.seed = seed

    def prepare_data(self):
        """Download/generate: call it on one process per node."""
        os.makedirs(self.root, exist_ok=True)
        rng = np.random.default_rng(self.seed)
        x = rng.normal(size=(960, 7)).astype(np.float32)
        y = (np.sin(x[:, 0]) + x[:, 1] * x[:, 2] - 0.5 * x[:, 3]).astype(np.float32)[:, None]
        np.save(os.path.join(self.root, "x.npy"), x)
        np.save(os.path.join(self.root, "y.npy"), y)

    def setup(self, rank, world_size):
        x = torch.from_numpy(np.load(os.path.join(self.root, "x.npy")))
        y = torch.from_numpy(np.load(os.path.join(self.root, "y.npy")))
        self.train_ds = TensorDataset(x[:800], y[:800])
        self.val_ds = TensorDataset(x[800:], y[800:])
        self.sampler = DistributedSampler(self.train_ds, num_replicas=world_size, rank=rank, seed=self.seed)
        self.val_part = Subset(self.val_ds, range(rank, len(self.val_ds), world_size))

    def train_dataloader(self):
        return DataLoader(self.train_ds, batch_size=self.batch_size, sampler=self.sampler)

    def val_dataloader(self):
        return DataLoader(self.val_part, batch_size=80)


def save_checkpoint(model, optimizer, epoch, path="g2_last.pt"):
    torch.save(
        {"state_dict": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path
    )


def fit(model, optimizer, dm, device, epochs, rank):
    loss_fn = nn.SmoothL1Loss()
    for epoch in range(epochs):
        dm.sampler.set_epoch(epoch)
        model.train()
        running = torch.zeros(2, device=device)
        for xb, yb in dm.train_dataloader():
            xb, yb = xb.to(device), yb.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            running += torch.stack([loss.detach() * len(xb), running.new_tensor(len(xb))])
        model.eval()
        val = torch.zeros(2, device=device)
        with torch.no_grad():
            for xb, yb in dm.val_dataloader():
                xb, yb = xb.to(device), yb.to(device)
                val += torch.stack(
                    [
                        nn.functional.smooth_l1_loss(model.module(xb), yb, reduction="sum"),
                        val.new_tensor(len(xb)),
                    ]
                )
        stats = torch.cat([running, val])
        dist.all_reduce(stats)
        if rank == 0:
            print(
                f"epoch {epoch} | train {(stats[0] / stats[1]).item():.4f}"
                f" | val {(stats[2] / stats[3]).item():.4f}"
            )
        save_checkpoint(model, optimizer, epoch)


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    on_gpu = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}") if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if on_gpu else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    dm = SyntheticDataModule()
    if local_rank == 0:
        dm.prepare_data()
    dist.barrier()  # the files are on disk
    dm.setup(rank, world_size)

    torch.manual_seed(dm.seed)
    model = nn.Sequential(nn.Linear(7, 32), nn.SiLU(), nn.Linear(32, 1)).to(device)
    model = DDP(model, device_ids=[local_rank] if on_gpu else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    fit(model, optimizer, dm, device, epochs=3, rank=rank)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
