# check_ddp: exit 0, warn step 6 DDP611
"""A denoiser trained as research code of the diffusion kind reads (EDM, UniMatch): argparse options, a
--resume that restores the model, the optimizer and the run's options, and a checkpoint that keeps the
options and the best loss beside the weights.

    torchrun --standalone --nproc_per_node=2 edm_resume_pickles_args.py
    torchrun --standalone --nproc_per_node=2 edm_resume_pickles_args.py --resume checkpoint.pth

Mistake: the checkpoint holds the argparse Namespace and a numpy number (the best loss). Since torch
2.6, torch.load loads with weights_only=True, which refuses both: the run that saves goes well, and the
resume (torch.load(args.resume, map_location=...)) fails with UnpicklingError.
"""

import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def get_args():
    parser = argparse.ArgumentParser("denoiser")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--sigma", type=float, default=0.5)
    parser.add_argument("--resume", default="", help="a checkpoint to continue from")
    parser.add_argument("--output", default="checkpoint.pth")
    return parser.parse_args()


class Denoiser(nn.Module):
    def __init__(self, dim=16, hidden=64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim + 1, hidden), nn.SiLU(), nn.Linear(hidden, dim))

    def forward(self, x, sigma):
        return self.net(torch.cat([x, sigma.expand(len(x), 1)], dim=1))


def main():
    args = get_args()
    dist.init_process_group("nccl")
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(1024, 16, generator=g))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(0)
    model = Denoiser().to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    start_epoch, best = 0, np.float64("inf")
    if args.resume:
        checkpoint = torch.load(args.resume, map_location=f"cuda:{local_rank}")  # check_ddp: here
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start_epoch, best = checkpoint["epoch"], checkpoint["best"]
    model = DDP(model, device_ids=[local_rank])

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)
        totals = torch.zeros(2, device=device)
        for (x,) in loader:
            x = x.to(device)
            sigma = torch.full((1,), args.sigma, device=device)
            loss = (model(x + sigma * torch.randn_like(x), sigma) - x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(x), torch.tensor(float(len(x)), device=device)])
        dist.all_reduce(totals)
        epoch_loss = (totals[0] / totals[1]).item()
        best = min(best, np.float64(epoch_loss))
        if rank == 0:
            print(f"epoch {epoch}: loss {epoch_loss:.4f} (best {best:.4f})")
            torch.save(  # check_ddp: here
                {
                    "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "epoch": epoch + 1,
                    "best": best,
                    "args": args,
                },
                args.output,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
