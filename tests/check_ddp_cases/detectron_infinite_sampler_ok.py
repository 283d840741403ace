# check_ddp: exit 0
"""Iteration-based training in the style of detectron2's and DINOv2's trainers: a sampler that never
ends, each rank taking its share of an endless seeded shuffle, and a loop over a number of iterations,
not epochs. GPU only.

    torchrun --standalone --nproc_per_node=2 detectron_infinite_sampler_ok.py

Correct. The sampler has no length, by design: a checker must not ask it for one (a DataLoader's
len() asks the sampler's), nor call anything of the script's that the script does not call.
"""

import itertools
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Sampler, TensorDataset


class InfiniteSampler(Sampler):
    """An endless stream of indices: every rank shuffles alike (one seed), and keeps every world_size-th
    index from its rank on, as detectron2's TrainingSampler does."""

    def __init__(self, size, seed=0):
        self._size, self._seed = size, seed
        self._rank, self._world_size = dist.get_rank(), dist.get_world_size()

    def __iter__(self):
        yield from itertools.islice(self._infinite_indices(), self._rank, None, self._world_size)

    def _infinite_indices(self):
        g = torch.Generator().manual_seed(self._seed)
        while True:
            yield from torch.randperm(self._size, generator=g).tolist()


def main():
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    g = torch.Generator().manual_seed(1)
    x = torch.randn(600, 10, generator=g)
    data = TensorDataset(x, (x.sum(1) > 0).long())
    loader = DataLoader(data, batch_size=16, sampler=InfiniteSampler(len(data)), num_workers=0)

    model = DDP(
        nn.Sequential(nn.Linear(10, 32), nn.ReLU(), nn.Linear(32, 2)).to(device), device_ids=[local_rank]
    )
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    max_iter, period = 60, 20
    losses = torch.zeros(2, device=device)
    for iteration, (inputs, targets) in zip(range(max_iter), loader, strict=False):  # the loader never ends
        loss = nn.functional.cross_entropy(model(inputs.to(device)), targets.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses += torch.stack([loss.detach() * len(inputs), loss.new_tensor(len(inputs))])
        if (iteration + 1) % period == 0:
            dist.all_reduce(losses)
            if dist.get_rank() == 0:
                print(f"iter {iteration + 1}: loss {(losses[0] / losses[1]).item():.4f}")
                torch.save(
                    {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()},
                    "model_final.pth",
                )
            losses.zero_()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
