# check_ddp: exit 1, FAIL step 8 DDP801
"""An ImageNet-example-shaped script (main() parses, main_worker(gpu, ngpus_per_node, args) trains) that
starts its workers with torch.multiprocessing.start_processes, choosing the start method itself. GPU only.

    python imagenet_start_processes.py --epochs 2     # as its author runs it, one process per GPU

Mistake: under torchrun each of its processes starts ngpus_per_node more.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main_worker(gpu, ngpus_per_node, args):
    args.rank = args.node_rank * ngpus_per_node + gpu
    dist.init_process_group(
        backend="nccl",
        init_method=args.dist_url,
        world_size=args.world_size,
        rank=args.rank,
    )
    torch.cuda.set_device(gpu)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 10)).cuda(gpu)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(256, 3, 4, 4, generator=g),
        torch.randint(0, 10, (256,), generator=g),
    )
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for images, target in loader:
            loss = nn.functional.cross_entropy(model(images.cuda(gpu)), target.cuda(gpu))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
    parser.add_argument("--epochs", default=2, type=int)
    parser.add_argument("--node-rank", default=0, type=int)
    parser.add_argument("--dist-url", default="tcp://127.0.0.1:23456", type=str)
    args = parser.parse_args()
    ngpus_per_node = torch.cuda.device_count()
    args.world_size = ngpus_per_node
    mp.start_processes(  # check_ddp: here
        main_worker,
        nprocs=ngpus_per_node,
        args=(ngpus_per_node, args),
        start_method="spawn",
    )
    print(os.getpid(), "done")


if __name__ == "__main__":
    main()
