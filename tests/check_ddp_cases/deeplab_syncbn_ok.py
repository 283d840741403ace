# check_ddp: exit 0
"""A segmentation model with BatchNorm in the style of the torchvision segmentation references: the
model's BatchNorm layers converted to SyncBatchNorm before the DDP wrap, so that the batch statistics
are those of the global batch. GPU only.

    torchrun --standalone --nproc_per_node=2 deeplab_syncbn_ok.py

Correct. (On a CPU, SyncBatchNorm cannot run; check_ddp's stand-in computes it as BatchNorm.)
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_model():
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 4, 1)
    )  # fmt: skip


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    g = torch.Generator().manual_seed(21)
    images = torch.randn(192, 3, 12, 12, generator=g)
    targets = (images[:, 0] > 0).long() + (images[:, 1] > 0).long()
    data = TensorDataset(images, targets)
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=16, sampler=sampler, num_workers=1, pin_memory=True)
    torch.manual_seed(21)
    model = nn.SyncBatchNorm.convert_sync_batchnorm(make_model()).cuda()
    model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=1e-4)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        confmat = torch.zeros(2, device=f"cuda:{local_rank}")
        for image, target in loader:
            image, target = image.cuda(non_blocking=True), target.cuda(non_blocking=True)
            output = model(image)
            loss = nn.functional.cross_entropy(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            correct = (output.argmax(1) == target).sum().float()
            confmat += torch.stack([correct, torch.tensor(float(target.numel())).cuda()])
        dist.all_reduce(confmat)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: pixel accuracy {(confmat[0] / confmat[1]).item():.3f}")
    if dist.get_rank() == 0:
        torch.save(
            {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, "model_final.pth"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
