# check_ddp: exit 1, FAIL step 8 DDP808
"""Contrastive pre-training in the style of a popular SimCLR re-implementation: a `main(gpu, args)`
that spawns itself across nodes when `args.nodes > 1`, and on one node simply trains, with the node's
rank `args.nr` deciding who logs and saves. GPU only.

    python simclr_never_asks_rank.py        # one node, as its README says

Mistake, under torchrun: on one node the script never asks who it is (no RANK, no LOCAL_RANK, no
process group): each of torchrun's processes runs the whole job, on the whole data, alone.
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def main(gpu, args):
    rank = args.nr * args.gpus + gpu  # the node's rank and the GPU: the script's own numbering
    device = torch.device("cuda", gpu)
    g = torch.Generator().manual_seed(args.seed)
    views = torch.randn(512, 2, 16, generator=g)
    loader = DataLoader(TensorDataset(views), batch_size=args.batch_size, shuffle=True, drop_last=True)
    torch.manual_seed(args.seed)
    encoder = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).to(device)
    optimizer = torch.optim.Adam(encoder.parameters(), lr=3e-4)
    for epoch in range(args.epochs):
        for (batch,) in loader:
            z = nn.functional.normalize(encoder(batch.to(device)), dim=-1)
            logits = z[:, 0] @ z[:, 1].T / 0.5
            loss = nn.functional.cross_entropy(logits, torch.arange(len(logits), device=device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if rank == 0:
            print(f"Epoch [{epoch}/{args.epochs}]\t Loss: {loss.item():.4f}")
    if args.nr == 0:
        torch.save({"model": encoder.state_dict(), "optimizer": optimizer.state_dict()}, "checkpoint.tar")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="SimCLR")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--nr", type=int, default=0, help="ranking within the nodes")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    main(0, args)
