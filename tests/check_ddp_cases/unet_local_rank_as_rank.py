# check_ddp: exit 1, FAIL step 1 DDP106
"""A research lab's segmentation training script, multi-GPU version: `device = local_rank`, the model
moved with `.to(local_rank)`, and the process group told the rank and the world size outright. GPU only.

    torchrun --standalone --nproc_per_node=2 unet_local_rank_as_rank.py

Mistake: init_process_group(rank=local_rank, world_size=2): right only on one node of exactly two GPUs.
On two nodes both first processes claim rank 0; on one node of four, the world is not the job's.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class TinyUNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(1, 8, 3, padding=1)
        self.up = nn.Conv2d(8, 1, 3, padding=1)

    def forward(self, x):
        return self.up(torch.relu(self.down(x)))


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    device = local_rank
    dist.init_process_group(  # check_ddp: here
        backend="nccl", init_method="env://", rank=device, world_size=2
    )
    torch.cuda.set_device(device)
    g = torch.Generator().manual_seed(4)
    images = torch.rand(128, 1, 16, 16, generator=g)
    masks = (images > 0.5).float()
    data = TensorDataset(images, masks)
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    torch.manual_seed(4)
    model = DDP(TinyUNet().to(device), device_ids=[device])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.binary_cross_entropy_with_logits(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    if dist.get_rank() == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, "unet.pth")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
