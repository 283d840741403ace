# check_ddp: exit 1, FAIL step 2 DDP203
"""A detector's training loop in the style of the small YOLO re-implementations on GitHub: a
`select_device()` that returns "cuda" when there is one, `model.cuda()`, batches `.cuda()`, and the rank
from `dist.get_rank()` for logging. GPU only.

    torchrun --standalone --nproc_per_node=2 yolo_cuda_no_set_device.py

Mistake: the process never picks its GPU: no `torch.cuda.set_device(LOCAL_RANK)`, so "cuda" is cuda:0 in
every process, and all the processes of a node train on GPU 0.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def select_device():
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def train(epochs=3, batch_size=16):
    dist.init_process_group(backend="nccl")
    rank = dist.get_rank()
    device = select_device()
    g = torch.Generator().manual_seed(0)
    imgs = torch.randn(384, 3, 16, 16, generator=g)
    targets = torch.rand(384, 4, generator=g)
    dataset = TensorDataset(imgs, targets)
    sampler = DistributedSampler(dataset, shuffle=True)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, pin_memory=True)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, 2), nn.SiLU(), nn.Flatten(), nn.Linear(8 * 7 * 7, 4))
    model = model.cuda()  # check_ddp: here
    model = DDP(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        mloss = torch.zeros(2, device=device)
        for imgs_, targets_ in loader:
            imgs_, targets_ = (
                imgs_.cuda(non_blocking=True),
                targets_.cuda(non_blocking=True),
            )
            loss = nn.functional.smooth_l1_loss(model(imgs_).sigmoid(), targets_)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mloss += torch.stack(
                [
                    loss.detach() * len(imgs_),
                    torch.tensor(float(len(imgs_)), device=device),
                ]
            )
        dist.all_reduce(mloss)
        if rank == 0:
            print(f"{epoch}/{epochs - 1} box loss {(mloss[0] / mloss[1]).item():.4f}")
            torch.save(
                {
                    "epoch": epoch,
                    "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                },
                "last.pt",
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    train()
