# check_ddp: exit 1, FAIL step 8 DDP805, warn step 6 DDP616
"""A classification script written for torch.distributed.launch, as NVIDIA's apex examples and many
repositories of that time were: `--local_rank` (default -1) from the command line decides who saves,
`if args.local_rank == 0:`, while the GPU already comes from torchrun's LOCAL_RANK. GPU only.

    python -m torch.distributed.launch --nproc_per_node=2 apex_local_rank_guarded_save.py   # as written for
    torchrun --standalone --nproc_per_node=2 apex_local_rank_guarded_save.py

Mistake: torchrun never passes --local_rank, so every process keeps -1 and no process meets the guard:
the job trains, and no checkpoint is ever written. Run again as torch.distributed.launch starts it
(--local_rank passed), the guard shows its second mistake: local rank 0 is one process a node, so on
nodes that share a disk two processes write the checkpoint at once (a warning: one node is fine).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser(description="PyTorch classification training")
parser.add_argument("--local_rank", default=-1, type=int, help="set by torch.distributed.launch")
parser.add_argument("--epochs", default=2, type=int)
parser.add_argument("--batch-size", default=32, type=int)


def main():
    args = parser.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(512, 3, 4, 4, generator=g), torch.randint(0, 10, (512,), generator=g))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = nn.Sequential(nn.Flatten(), nn.Linear(48, 10)).cuda()
    model = DDP(model, device_ids=[local_rank], output_device=local_rank)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        stats = torch.zeros(2).cuda()
        for images, target in loader:
            loss = nn.functional.cross_entropy(model(images.cuda(non_blocking=True)), target.cuda())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            stats += torch.stack([loss.detach() * len(images), loss.new_tensor(len(images))])
        dist.all_reduce(stats)
        if args.local_rank == 0:  # check_ddp: here
            print(f"Epoch {epoch}: loss {(stats[0] / stats[1]).item():.4f}")
            torch.save(
                {
                    "epoch": epoch + 1,
                    "state_dict": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                },
                "checkpoint.pth.tar",
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
