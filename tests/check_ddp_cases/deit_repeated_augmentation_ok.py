# check_ddp: exit 0
"""An image classifier's training script in the style of DeiT's main.py: repeated augmentation, a
sampler of its own (as DeiT's RASampler) that repeats each sample for 3 ranks, each to augment it
its own way, and keeps each rank's share of an epoch to the data's size / N. GPU only.

    torchrun --standalone --nproc_per_node=2 deit_repeated_augmentation_ok.py

Correct. What a checker must not get wrong here: the ranks' shards overlap, and a rank sees some
samples twice in an epoch, by the sampler's design (each copy is augmented differently); the job
still goes over one epoch's worth of data per epoch, as with a DistributedSampler.
"""

import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, Sampler


class RepeatedAugSampler(Sampler):
    """Each sample repeated num_repeats times, the copies dealt to consecutive ranks; each rank keeps
    its share of an epoch (the data's size / N), as a DistributedSampler's rank does."""

    def __init__(self, dataset, num_repeats=3):
        self.dataset, self.num_repeats = dataset, num_repeats
        self.world, self.rank = dist.get_world_size(), dist.get_rank()
        self.num_samples = math.ceil(len(dataset) * num_repeats / self.world)
        self.total_size = self.num_samples * self.world
        self.selected = len(dataset) // self.world
        self.epoch = 0

    def __iter__(self):
        g = torch.Generator().manual_seed(self.epoch)
        order = torch.randperm(len(self.dataset), generator=g)
        indices = torch.repeat_interleave(order, self.num_repeats).tolist()
        indices += indices[: self.total_size - len(indices)]
        return iter(indices[self.rank : self.total_size : self.world][: self.selected])

    def __len__(self):
        return self.selected

    def set_epoch(self, epoch):
        self.epoch = epoch


class Augmented(Dataset):
    """Images with a random flip and a little noise: each draw of a sample is augmented anew."""

    def __init__(self, n=512):
        g = torch.Generator().manual_seed(0)
        self.images = torch.randn(n, 3, 8, 8, generator=g)
        self.labels = torch.randint(0, 10, (n,), generator=g)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        image = self.images[i]
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        return image + 0.05 * torch.randn_like(image), self.labels[i]


def main():
    dist.init_process_group("nccl")
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    data = Augmented()
    sampler = RepeatedAugSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler, drop_last=True)
    model = DDP(
        nn.Sequential(nn.Flatten(), nn.Linear(192, 64), nn.GELU(), nn.Linear(64, 10)).to(device),
        device_ids=[local_rank],
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for epoch in range(3):
        sampler.set_epoch(epoch)
        total, count = torch.zeros((), device=device), torch.zeros((), device=device)
        for images, labels in loader:
            images, labels = images.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            loss = nn.functional.cross_entropy(model(images), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.detach() * len(labels)
            count += len(labels)
        sums = torch.stack([total, count])
        dist.all_reduce(sums)
        if rank == 0:
            print(f"epoch {epoch}: train loss {(sums[0] / sums[1]).item():.4f}")
            torch.save({"model": model.module.state_dict(), "epoch": epoch}, "checkpoint.pth")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
