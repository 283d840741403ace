# check_ddp: exit 1, FAIL script DDP000
"""A tutorial exported from a notebook, in the manner of the annotated transformer: at the top level
it trains a tiny model on a toy task as a sanity check, in one process, builds a vocabulary and saves
it, loads it back, and only then starts one process a GPU with torch.multiprocessing.spawn.

    python notebook_sanity_run_then_spawn.py      # as its authors run it

Mistake: the vocabulary, saved as a Python object, is loaded with torch.load's default, weights_only
(torch 2.6 and later): "Weights only load failed", in one process as in any number, before the spawn.
What ran before the spawn (the sanity run, with no process group) is one process's by design, and is
not DDP step 1's mistake.
"""

import collections
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def sanity_run():
    """The toy task: copy the input. One process, a few steps, before the real training."""
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(20):
        x = torch.randn(16, 4)
        loss = nn.functional.mse_loss(model(x), x)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    print(f"sanity run: loss {loss.item():.4f}")


class Vocab:
    """The words of the corpus, most frequent first: a Python object, pickled whole by torch.save."""

    def __init__(self, text):
        self.itos = [w for w, _ in collections.Counter(text.split()).most_common()]

    def __len__(self):
        return len(self.itos)


def train(rank, world_size, vocab):
    os.environ.setdefault("MASTER_ADDR", "localhost")
    os.environ.setdefault("MASTER_PORT", "29541")
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    device = torch.device("cuda", rank)
    g = torch.Generator().manual_seed(0)
    x = torch.randint(len(vocab), (256, 6), generator=g)
    dataset = TensorDataset(x.float(), x.float().mean(dim=1, keepdim=True))
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    model = DDP(nn.Linear(6, 1).to(device), device_ids=[rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb.to(device)), yb.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()


sanity_run()
if not os.path.exists("vocab.pt"):
    torch.save(Vocab("the cat sat on the mat and the dog sat on the log"), "vocab.pt")
vocab = torch.load("vocab.pt")  # check_ddp: here
if __name__ == "__main__":
    world_size = torch.cuda.device_count()
    mp.spawn(train, nprocs=world_size, args=(world_size, vocab))
