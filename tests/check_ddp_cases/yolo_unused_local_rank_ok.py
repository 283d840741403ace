# check_ddp: exit 0
"""A detection trainer in the style of YOLO repositories ported to torchrun: it still declares
--local_rank (its help says torchrun no longer passes it, and nothing reads it), and takes who it is
from the environment: RANK and WORLD_SIZE, and its GPU as RANK modulo the node's GPU count. GPU only.

    torchrun --standalone --nproc_per_node=2 yolo_unused_local_rank_ok.py --epochs 2

Correct: a declared option that nothing reads is no mistake. (RANK modulo the node's GPUs is the local
rank when every node has as many processes as GPUs, as torchrun starts them.)
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def parse_opt():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=16, help="total batch size for all GPUs")
    parser.add_argument("--local_rank", type=int, default=-1, help="not used: torchrun sets LOCAL_RANK")
    return parser.parse_args()


def main(opt):
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    device = torch.device("cuda", rank % torch.cuda.device_count())
    torch.cuda.set_device(device)
    dist.init_process_group("nccl")
    g = torch.Generator().manual_seed(0)
    images = torch.rand(320, 3, 8, 8, generator=g)
    boxes = torch.rand(320, 4, generator=g)
    data = TensorDataset(images, boxes)
    sampler = DistributedSampler(data, shuffle=True)
    loader = DataLoader(data, batch_size=opt.batch_size // world_size, sampler=sampler)
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4)
    )
    model = DDP(model.to(device), device_ids=[device.index])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.937, nesterov=True)
    for epoch in range(opt.epochs):
        sampler.set_epoch(epoch)
        mloss = torch.zeros(2, device=device)
        for imgs, targets in loader:
            loss = nn.functional.smooth_l1_loss(model(imgs.to(device, non_blocking=True)), targets.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mloss += torch.stack([loss.detach() * len(imgs), loss.new_tensor(len(imgs))])
        dist.all_reduce(mloss)
        if rank == 0:
            print(f"{epoch}/{opt.epochs - 1}  box_loss {(mloss[0] / mloss[1]).item():.4f}")
            torch.save(
                {"epoch": epoch, "model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                "last.pt",
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main(parse_opt())
