# check_ddp: exit 1, FAIL step 6 DDP615
"""A Trainer-class image classifier (synthetic 8x8 "glyphs") with a --resume flag, in the style
of a lab's in-house training loop. To exercise the resume path in one launch, the script first
runs a short job that writes `last.pt`, then starts the real job with --resume pointing at it.

    torchrun --standalone --nproc_per_node=2 b2_resume_main_after_wrap.py
    torchrun --standalone --nproc_per_node=2 b2_resume_main_after_wrap.py --resume b2_last.pt

Mistake: Trainer.load_checkpoint runs after the DDP wrap, and only `if self.is_main:` does it
load the weights (into self.model.module) and the Adam state; the start epoch is broadcast, so
every rank runs the same epochs and nothing hangs. But DDP broadcast the weights at the wrap,
before the load: from then on rank 0 trains the resumed weights and rank 1 the fresh ones, with
the same averaged gradients, so the replicas silently differ (and so do their Adam moments).
The README says every rank loads the same checkpoint before the wrap: FAIL step 6.
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


class GlyphNet(nn.Module):
    def __init__(self, n_classes=4):
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 3, padding=1)
        self.fc = nn.Linear(6 * 4 * 4, n_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(x.flatten(1))


def glyphs(n, seed):
    protos = torch.randn(4, 1, 8, 8, generator=torch.Generator().manual_seed(99))
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    return TensorDataset(protos[y] + torch.randn(n, 1, 8, 8, generator=g), y)


class Trainer:
    def __init__(self, args, device, resume=None):
        self.args = args
        self.device = device
        self.is_main = dist.get_rank() == 0
        train_set, val_set = glyphs(640, seed=1), glyphs(200, seed=2)
        self.sampler = DistributedSampler(train_set, seed=args.seed)
        self.loader = DataLoader(train_set, batch_size=args.batch_size, sampler=self.sampler)
        rank, world = dist.get_rank(), dist.get_world_size()
        self.val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world)), batch_size=100)
        torch.manual_seed(args.seed)
        net = GlyphNet().to(device)
        self.model = DDP(net, device_ids=[device.index] if device.type == "cuda" else None)
        self.opt = torch.optim.Adam(self.model.parameters(), lr=args.lr)
        self.start_epoch = 0
        if resume:
            self.load_checkpoint(resume)

    def load_checkpoint(self, path):
        start = [0]
        if self.is_main:
            state = torch.load(path, map_location=self.device)
            self.model.module.load_state_dict(state["model"])
            self.opt.load_state_dict(state["optimizer"])
            start = [state["epoch"]]
            print(f"=> resumed '{path}' (epoch {state['epoch']})")
        dist.broadcast_object_list(start, src=0)  # every rank agrees on where to start
        self.start_epoch = start[0]

    def save_checkpoint(self, epoch):
        if self.is_main:
            torch.save(
                {
                    "model": self.model.module.state_dict(),
                    "optimizer": self.opt.state_dict(),
                    "epoch": epoch + 1,
                },
                self.args.ckpt,
            )

    def validate(self):
        self.model.eval()
        stats = torch.zeros(2, device=self.device)
        with torch.no_grad():
            for x, y in self.val_loader:
                x, y = x.to(self.device), y.to(self.device)
                stats += torch.stack(
                    [(self.model.module(x).argmax(1) == y).sum().float(), stats.new_tensor(len(y))]
                )
        dist.all_reduce(stats)
        return (stats[0] / stats[1]).item()

    def train(self, epochs):
        for epoch in range(self.start_epoch, epochs):
            self.sampler.set_epoch(epoch)
            self.model.train()
            totals = torch.zeros(2, device=self.device)
            for x, y in self.loader:
                x, y = x.to(self.device), y.to(self.device)
                loss = F.cross_entropy(self.model(x), y)
                self.opt.zero_grad(set_to_none=True)
                loss.backward()
                self.opt.step()
                totals += torch.stack([loss.detach() * len(y), totals.new_tensor(len(y))])
            dist.all_reduce(totals)
            acc = self.validate()
            if self.is_main:
                print(f"epoch {epoch}: train loss {(totals[0] / totals[1]).item():.4f}  val acc {acc:.3f}")
            self.save_checkpoint(epoch)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ckpt", default="b2_last.pt")
    parser.add_argument("--resume", default=None, help="checkpoint to resume from")
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")

    if args.resume is None:
        # no checkpoint given: write one first (a 1-epoch job), so that the resume path runs
        Trainer(args, device).train(epochs=1)
        dist.barrier()
        args.resume = args.ckpt
    Trainer(args, device, resume=args.resume).train(epochs=args.epochs)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
