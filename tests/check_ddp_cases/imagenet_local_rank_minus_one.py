# check_ddp: exit 1, FAIL step 8 DDP805
"""An ImageNet training script from a popular "pytorch distributed" tutorial repository, written for
torch.distributed.launch: `--local_rank` from the command line (default -1), `torch.cuda.set_device`,
`.cuda(args.local_rank)`, `DDP(device_ids=[args.local_rank])`. GPU only.

    python -m torch.distributed.launch --nproc_per_node=2 imagenet_local_rank_minus_one.py   # as written for

Mistake: torchrun passes no --local_rank: every process keeps -1, set_device(-1) does nothing, and
`.cuda(-1)` fails.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
parser.add_argument("--local_rank", default=-1, type=int, help="node rank for distributed training")
parser.add_argument("--epochs", default=2, type=int)


def main():
    args = parser.parse_args()  # check_ddp: here
    dist.init_process_group(backend="nccl")
    torch.cuda.set_device(args.local_rank)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 10)).cuda(args.local_rank)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank])
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 3, 4, 4, generator=g), torch.randint(0, 10, (256,), generator=g))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for images, target in loader:
            loss = nn.functional.cross_entropy(
                model(images.cuda(args.local_rank)), target.cuda(args.local_rank)
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
