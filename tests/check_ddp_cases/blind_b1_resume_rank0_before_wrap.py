# check_ddp: exit 1, FAIL step 6 DDP615
"""A regression job that survives pre-emption, written as a main() with argparse: it trains
--stop-after epochs, checkpoints, and then (to exercise the restart path in one launch) builds
a fresh model and optimizer and resumes from that checkpoint up to --epochs.

    torchrun --standalone --nproc_per_node=2 b1_resume_rank0_before_wrap.py

Mistake: the resume (`resume_from`) runs under `if rank == 0:`, before the DDP wrap: rank 0
loads the model, the optimizer and the start epoch, the other ranks keep a fresh optimizer
and start_epoch = 0. DDP's wrap happens to broadcast rank 0's weights, hiding half of it, but
rank 1 loops over 4 epochs against rank 0's 2, so rank 1 waits in a gradient all-reduce that
rank 0 never joins: the job dies (or hangs) at the end. The README's rule is that every rank
loads the same checkpoint before the wrap: FAIL step 6 (what follows is its consequence).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def get_args():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--stop-after", type=int, default=2, help="epochs before the simulated pre-emption")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--ckpt", default="b1_resume.pt")
    return p.parse_args()


def make_data(n=800, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 4, generator=g) * 2 - 1
    y = (x[:, :1] * x[:, 1:2] + x[:, 2:3].sin() - x[:, 3:]).contiguous()
    return TensorDataset(x, y)


def new_model():
    return nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1))


def run_epochs(model, optimizer, loader, sampler, device, start_epoch, end_epoch, ckpt_path):
    rank = dist.get_rank()
    for epoch in range(start_epoch, end_epoch):
        sampler.set_epoch(epoch)
        model.train()
        totals = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(x), totals.new_tensor(len(x))])
        dist.all_reduce(totals)
        if rank == 0:
            print(f"[epoch {epoch}] loss {(totals[0] / totals[1]).item():.5f}")
            torch.save(
                {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1},
                ckpt_path,
            )


def resume_from(path, model, optimizer):
    ckpt = torch.load(path, map_location="cpu")
    model.load_state_dict(ckpt["model"])
    optimizer.load_state_dict(ckpt["optimizer"])
    return ckpt["epoch"]


def main():
    args = get_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank = dist.get_rank()
    device_ids = [local_rank] if device.type == "cuda" else None

    dataset = make_data()
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    # first life of the job: train until the pre-emption
    torch.manual_seed(0)
    model = new_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    model = DDP(model, device_ids=device_ids)
    run_epochs(model, optimizer, loader, sampler, device, 0, args.stop_after, args.ckpt)
    dist.barrier()  # the checkpoint is on disk
    del model, optimizer

    # second life: a fresh model and optimizer, resumed from the checkpoint
    torch.manual_seed(0)
    model = new_model().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start_epoch = 0
    if rank == 0 and os.path.exists(args.ckpt):
        start_epoch = resume_from(args.ckpt, model, optimizer)
        print(f"resumed from {args.ckpt} at epoch {start_epoch}")
    model = DDP(model, device_ids=device_ids)
    run_epochs(model, optimizer, loader, sampler, device, start_epoch, args.epochs, args.ckpt)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
