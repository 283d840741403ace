# check_ddp: exit 0
"""A classifier trained through a streaming sampler of the author's own (the kind written for
datasets read as a stream: webdataset-style shuffle buffer), plugged into a DataLoader, with a
main() and argparse.

    torchrun --standalone --nproc_per_node=2 d1_shuffle_buffer_sampler.py

Correct: StreamShuffleSampler deals rank r the indices r, r+N, r+2N, ... (the shards are
disjoint, of equal length, and cover the data), cycles over its shard forever, and shuffles
through a 64-slot buffer that lives across epochs (there is no epoch boundary in the stream,
so set_epoch has nothing to do and is absent). An "epoch" is len(shard) draws from that stream:
a rank can meet a sample twice in one epoch, and another not at all, by design of the buffer,
not because ranks overlap. Every rank draws the same number of batches; the rest is the
README's form: exit 0.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Sampler, Subset, TensorDataset


class StreamShuffleSampler(Sampler):
    """Rank-strided shard, streamed forever through a shuffle buffer (no epoch boundary)."""

    def __init__(self, data_len, rank, world_size, buffer_size=64, seed=0):
        self.shard = list(range(rank, data_len - data_len % world_size, world_size))
        self.buffer_size = buffer_size
        self.gen = torch.Generator().manual_seed(seed + rank)
        self._stream = self._shuffled_stream()

    def _source(self):
        while True:  # cycle over the shard, pass after pass
            yield from self.shard

    def _shuffled_stream(self):
        source = self._source()
        buffer = [next(source) for _ in range(self.buffer_size)]
        while True:
            j = int(torch.randint(len(buffer), (1,), generator=self.gen))
            yield buffer[j]
            buffer[j] = next(source)

    def __len__(self):
        return len(self.shard)

    def __iter__(self):
        for _ in range(len(self)):
            yield next(self._stream)


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 12, generator=g)
    w = torch.randn(12, 3, generator=torch.Generator().manual_seed(1000))
    y = (x @ w).argmax(1)
    return TensorDataset(x, y)


def main():
    parser = argparse.ArgumentParser(description="stream-shuffled DDP training")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--buffer", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    args = parser.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()

    train_set, val_set = make_dataset(1024, seed=0), make_dataset(250, seed=1)
    sampler = StreamShuffleSampler(len(train_set), rank, world_size, buffer_size=args.buffer, seed=0)
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)), batch_size=128)

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 48), nn.ReLU(), nn.Linear(48, 3)).to(device)
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    for epoch in range(args.epochs):
        model.train()
        totals = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(y), totals.new_tensor(len(y))])
        dist.all_reduce(totals)

        model.eval()
        val = torch.zeros(2, device=device)
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                val += torch.stack([(model.module(x).argmax(1) == y).sum().float(), val.new_tensor(len(y))])
        dist.all_reduce(val)
        if rank == 0:
            print(
                f"epoch {epoch}  loss {(totals[0] / totals[1]).item():.4f}"
                f"  val acc {(val[0] / val[1]).item():.3f}"
            )
            torch.save(
                {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                "d1_checkpoint.pt",
            )

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
