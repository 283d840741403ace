# check_ddp: exit 0
"""A main()-style script with a `logging` setup function, in the manner of many lab codebases:
setup_logger() attaches a console handler and a FileHandler to `run.log`, and the level is
raised on the non-zero ranks so that only rank 0 reports.

    torchrun --standalone --nproc_per_node=2 c2_filehandler_mode_w.py --epochs 3

Correct: setup_logger() runs on every rank and creates `logging.FileHandler(path, mode="w")`,
which opens (creates/truncates) run.log on each rank at start; but only rank 0's logger is at
INFO, the others at ERROR, and nothing logs an error, so rank 0 is the only process that ever
writes a line there, and its first line comes after the DDP wrap (a collective every rank has
reached). Opening a file with "w" on every rank writes nothing: one writer, exit 0.
"""

import argparse
import logging
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def setup_logger(path, rank):
    logger = logging.getLogger("train")
    logger.setLevel(logging.INFO if rank == 0 else logging.ERROR)
    fmt = logging.Formatter("%(asctime)s [%(levelname)s] %(message)s")
    for handler in (logging.StreamHandler(sys.stdout), logging.FileHandler(path, mode="w")):
        handler.setFormatter(fmt)
        logger.addHandler(handler)
    return logger


def synthetic_sequences(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, 3, generator=g)
    y = (x[:, :, 0].cumsum(1)[:, -1] > 0).long()
    return TensorDataset(x, y)


class TinyGRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(3, 16, batch_first=True)
        self.head = nn.Linear(16, 2)

    def forward(self, x):
        _, h = self.rnn(x)
        return self.head(h[-1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--bs", type=int, default=32)
    parser.add_argument("--log-file", default="run.log")
    args = parser.parse_args()

    rank_env = int(os.environ["RANK"])
    logger = setup_logger(args.log_file, rank_env)  # every rank: FileHandler(mode="w")

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()

    train_ds, val_ds = synthetic_sequences(512, seed=3), synthetic_sequences(150, seed=4)
    sampler = DistributedSampler(train_ds, shuffle=True, seed=3)
    train_dl = DataLoader(train_ds, batch_size=args.bs, sampler=sampler)
    val_dl = DataLoader(Subset(val_ds, range(rank, len(val_ds), world)), batch_size=64)

    torch.manual_seed(3)
    model = DDP(TinyGRU().to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    optim = torch.optim.AdamW(model.parameters(), lr=5e-3)
    logger.info("world size %d, %d training samples, %d epochs", world, len(train_ds), args.epochs)

    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        model.train()
        sums = torch.zeros(2, device=device)
        for x, y in train_dl:
            x, y = x.to(device), y.to(device)
            optim.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optim.step()
            sums += torch.stack([loss.detach() * y.numel(), sums.new_tensor(y.numel())])
        dist.all_reduce(sums)

        model.eval()
        vsums = torch.zeros(3, device=device)
        with torch.no_grad():
            for x, y in val_dl:
                x, y = x.to(device), y.to(device)
                out = model.module(x)
                vsums += torch.stack(
                    [
                        F.cross_entropy(out, y, reduction="sum"),
                        (out.argmax(1) == y).sum().float(),
                        vsums.new_tensor(y.numel()),
                    ]
                )
        dist.all_reduce(vsums)
        logger.info(
            "epoch %d | train loss %.4f | val loss %.4f | val acc %.3f",
            epoch,
            (sums[0] / sums[1]).item(),
            (vsums[0] / vsums[2]).item(),
            (vsums[1] / vsums[2]).item(),
        )
        if rank == 0:
            torch.save(
                {"model": model.module.state_dict(), "optim": optim.state_dict(), "epoch": epoch},
                "c2_ckpt.pt",
            )

    logger.info("done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
