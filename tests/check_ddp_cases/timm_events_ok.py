# check_ddp: exit 0
"""Image classification in the style of timm's train.py: an args namespace, `args.distributed`,
`args.device = f"cuda:{args.local_rank}"`, a train_one_epoch() that times itself with CUDA events and
torch.cuda.synchronize(), reports peak GPU memory, and reduces its metrics with a reduce_tensor()
helper once an epoch. DataLoader workers feed the batches. GPU only.

    torchrun --standalone --nproc_per_node=2 timm_events_ok.py --epochs 3
"""

import argparse
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as NativeDDP
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class FakeImages(Dataset):
    def __init__(self, n=512, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.images = torch.randn(n, 3, 8, 8, generator=g)
        self.labels = (self.images.mean(dim=(1, 2, 3)) > 0).long()

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


def reduce_tensor(tensor, n):
    rt = tensor.clone()
    dist.all_reduce(rt, op=dist.ReduceOp.SUM)
    return rt / n


def train_one_epoch(epoch, model, loader, optimizer, loss_fn, args):
    start, end = (
        torch.cuda.Event(enable_timing=True),
        torch.cuda.Event(enable_timing=True),
    )
    start.record()
    loss_sum = torch.zeros((), device=args.device)
    for images, target in loader:
        images, target = (
            images.to(args.device, non_blocking=True),
            target.to(args.device, non_blocking=True),
        )
        loss = loss_fn(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach() * len(images)
    end.record()
    torch.cuda.synchronize()
    mean_loss = reduce_tensor(loss_sum, len(loader.dataset))
    if args.rank == 0:
        print(
            f"Train: {epoch} loss {mean_loss.item():.4f} time {start.elapsed_time(end):.0f} ms "
            f"max mem {torch.cuda.max_memory_allocated() / 2**20:.0f} MB"
        )


def main():
    parser = argparse.ArgumentParser(description="timm-style training")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    args.distributed = int(os.environ.get("WORLD_SIZE", 1)) > 1
    args.local_rank = int(os.environ.get("LOCAL_RANK", 0))
    args.device = f"cuda:{args.local_rank}"
    torch.cuda.set_device(args.local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")
    args.world_size, args.rank = dist.get_world_size(), dist.get_rank()

    dataset = FakeImages()
    sampler = DistributedSampler(dataset)
    loader = DataLoader(
        dataset,
        batch_size=32,
        sampler=sampler,
        num_workers=args.workers,
        pin_memory=True,
    )
    torch.manual_seed(42)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 2),
    )
    model.to(args.device)
    model = NativeDDP(model, device_ids=[args.local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss().to(args.device)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        train_one_epoch(epoch, model, loader, optimizer, loss_fn, args)
        if args.rank == 0:
            torch.save(
                {
                    "epoch": epoch,
                    "state_dict": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                },
                "checkpoint.pth.tar",
            )
    dist.destroy_process_group()
    time.sleep(0)


if __name__ == "__main__":
    main()
