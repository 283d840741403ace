# check_ddp: exit 1, FAIL step 3 DDP305
"""A script that preprocesses its dataset once per machine: LOCAL_RANK 0 generates the
(synthetic) features and writes them under ./data, the ranks meet at a barrier, then every rank
loads the same files. A flat main() in the style of many "prepare then train" research scripts.

    torchrun --standalone --nproc_per_node=2 g1_local_rank0_prepares_no_set_epoch.py

Mistakes (both step 3, both expected in the report): (1) a warn: the data is prepared once per
NODE, by LOCAL_RANK 0: on two nodes sharing one file system both nodes' local rank 0 write
data/train.pt and data/val.pt at the same moment (a multi-node race; harmless on one node).
(2) a FAIL: DistributedSampler(shuffle=True) but the epoch loop never calls
sampler.set_epoch(epoch), so every epoch replays the first epoch's order on each rank: the
shuffle happens once per job. The FAIL sets exit 1; step 3's line shows the FAIL.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

DATA_DIR = "data"


def prepare_data(seed=123):
    os.makedirs(DATA_DIR, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    feats = torch.randn(1100, 6, generator=g)
    feats[:, 3:] = feats[:, :3] ** 2 + 0.1 * feats[:, 3:]  # "feature engineering"
    labels = (feats[:, 0] + feats[:, 4] > 1).long()
    torch.save({"x": feats[:900], "y": labels[:900]}, os.path.join(DATA_DIR, "train.pt"))
    torch.save({"x": feats[900:], "y": labels[900:]}, os.path.join(DATA_DIR, "val.pt"))


def load_split(name):
    d = torch.load(os.path.join(DATA_DIR, f"{name}.pt"))
    return TensorDataset(d["x"], d["y"])


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    if local_rank == 0:
        prepare_data()  # once per node
    dist.barrier()
    train_set, val_set = load_split("train"), load_split("val")

    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=30, sampler=sampler)
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)), batch_size=100)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 2)).to(device)
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    for epoch in range(3):
        model.train()
        totals = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(y), totals.new_tensor(len(y))])
        model.eval()
        val = torch.zeros(2, device=device)
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                val += torch.stack([(model.module(x).argmax(1) == y).sum().float(), val.new_tensor(len(y))])
        stats = torch.cat([totals, val])
        dist.all_reduce(stats)
        if rank == 0:
            print(
                f"epoch {epoch}: loss {(stats[0] / stats[1]).item():.4f},"
                f" val acc {(stats[2] / stats[3]).item():.3f}"
            )
            torch.save(
                {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                "g1_checkpoint.pt",
            )

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
