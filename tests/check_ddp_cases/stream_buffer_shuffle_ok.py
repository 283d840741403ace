# check_ddp: exit 0
"""A streaming trainer in the manner of webdataset pipelines: one endless stream of sample ids, shuffled
through a buffer as it streams (no epoch boundary: the buffer carries samples from one pass of the data
into the next), and each rank keeping every N-th sample of the shuffled stream.

    torchrun --standalone --nproc_per_node=2 stream_buffer_shuffle_ok.py

Correct: the ranks split the stream's positions, so each trains on its own samples; but a buffer that
spans two passes of the data gives a sample twice in one epoch's worth of the stream, whoever takes it.
One process alone meets a sample twice within a pass too: that the ranks' draws of an epoch share a few
samples is the sampler's way of drawing, not data left unsharded.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Sampler, TensorDataset


class BufferedStreamSampler(Sampler):
    """The stream's positions rank, rank + N, ...: its samples shuffled through a buffer, seeded alike
    on every rank, never emptied between passes."""

    def __init__(self, size, rank, world_size, buffer_size=24, seed=0):
        self.size, self.rank, self.world_size = size, rank, world_size
        self.buffer_size, self.seed = buffer_size, seed
        self.position = 0  # where in the stream the next pass begins

    def __len__(self):
        return self.size // self.world_size

    def stream(self):
        generator = torch.Generator().manual_seed(self.seed)
        source = (i % self.size for i in range(10**9))  # the data's ids, pass after pass
        buffer = [next(source) for _ in range(self.buffer_size)]
        while True:
            j = int(torch.randint(len(buffer), (1,), generator=generator))
            yield buffer[j]
            buffer[j] = next(source)

    def __iter__(self):
        stream = self.stream()
        start = self.position
        self.position += len(self) * self.world_size
        for k, sample in enumerate(stream):
            if k >= start + len(self) * self.world_size:
                return
            if k >= start and k % self.world_size == self.rank:
                yield sample


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(240, 6, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    sampler = BufferedStreamSampler(len(data), rank, world_size)
    loader = DataLoader(data, batch_size=20, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(nn.Linear(6, 1).to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(3):
        totals = torch.zeros(2, device=device)
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(xb), totals.new_tensor(len(xb))])
        dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
