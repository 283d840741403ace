# check_ddp: exit 1, FAIL step 8 DDP805, FAIL step 4 DDP401
"""A script of the torch.distributed.launch era (BERT/apex-style fine-tuning scripts): argparse
REQUIRES --local_rank, which that launcher passed to each process, and the device is taken
from it; RANK/WORLD_SIZE/MASTER_* come from the launcher's environment (env://).

    python -m torch.distributed.launch --nproc_per_node=2 h2_local_rank_arg_unused_param.py
    torchrun --standalone --nproc_per_node=2 h2_local_rank_arg_unused_param.py   # as checked

Mistakes: (1) FAIL step 8: torchrun passes no --local_rank argument (it sets LOCAL_RANK in the
environment), so argparse stops every process at once ("the following arguments are required:
--local_rank", exit 2): the script is written for the old launcher. (2) FAIL step 4, which a
launch that passes --local_rank shows: RegressorWithAux has an `aux_head` used only when
forward(return_aux=True), which training never asks for; DDP (find_unused_parameters=False)
waits for its gradient and the second iteration raises "Expected to have finished reduction
in the prior iteration before starting a new one".
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class RegressorWithAux(nn.Module):
    def __init__(self, d_in=10, hidden=32):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d_in, hidden), nn.ReLU())
        self.head = nn.Linear(hidden, 1)
        self.aux_head = nn.Linear(hidden, 2)  # auxiliary task, off by default

    def forward(self, x, return_aux=False):
        h = self.body(x)
        out = self.head(h)
        if return_aux:
            return out, self.aux_head(h)
        return out


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--local_rank", "--local-rank", type=int, required=True, help="set by torch.distributed.launch"
    )
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--train_batch_size", type=int, default=16)
    parser.add_argument("--learning_rate", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--output_dir", default="h2_out")
    return parser.parse_args()


def main():
    args = parse_args()
    if torch.cuda.is_available():
        torch.cuda.set_device(args.local_rank)
        device = torch.device("cuda", args.local_rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", init_method="env://")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    g = torch.Generator().manual_seed(args.seed)
    x = torch.randn(600, 10, generator=g)
    y = x[:, :1] - 2 * x[:, 1:2] + 0.1 * torch.randn(600, 1, generator=g)
    train_ds, eval_ds = TensorDataset(x[:480], y[:480]), TensorDataset(x[480:], y[480:])
    sampler = DistributedSampler(train_ds, seed=args.seed)
    train_dl = DataLoader(train_ds, batch_size=args.train_batch_size, sampler=sampler)
    eval_dl = DataLoader(Subset(eval_ds, range(rank, len(eval_ds), world_size)), batch_size=60)

    torch.manual_seed(args.seed)
    model = RegressorWithAux().to(device)
    model = DDP(
        model,
        device_ids=[args.local_rank] if device.type == "cuda" else None,
        output_device=args.local_rank if device.type == "cuda" else None,
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        tr = torch.zeros(2, device=device)
        for xb, yb in train_dl:
            xb, yb = xb.to(device), yb.to(device)
            loss = F.mse_loss(model(xb), yb)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            tr += torch.stack([loss.detach() * len(xb), tr.new_tensor(len(xb))])
        model.eval()
        ev = torch.zeros(2, device=device)
        with torch.no_grad():
            for xb, yb in eval_dl:
                xb, yb = xb.to(device), yb.to(device)
                ev += torch.stack([F.mse_loss(model.module(xb), yb, reduction="sum"), ev.new_tensor(len(xb))])
        stats = torch.cat([tr, ev])
        dist.all_reduce(stats)
        if rank == 0:
            print(
                f"epoch {epoch}: train mse {(stats[0] / stats[1]).item():.4f}"
                f" eval mse {(stats[2] / stats[3]).item():.4f}"
            )
            os.makedirs(args.output_dir, exist_ok=True)
            torch.save(
                {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                os.path.join(args.output_dir, "checkpoint.pt"),
            )

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
