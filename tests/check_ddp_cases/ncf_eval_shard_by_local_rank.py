# check_ddp: exit 1, FAIL step 10 DDP1008
"""A recommender's trainer in the style of NVIDIA's NCF example: the test users are split between the
processes by LOCAL_RANK, each process scores its part, and hits are summed over the ranks with
all_reduce and divided by the number of test users. CPU code (gloo).

    torchrun --standalone --nproc_per_node=2 ncf_eval_shard_by_local_rank.py

Mistake: LOCAL_RANK numbers the processes of one node, and is the same on every node: on several nodes,
the processes with the same local rank score the same users, the other parts are never scored, and the
sum counts the same users several times. Split by the global rank, dist.get_rank().
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class NeuMF(nn.Module):
    def __init__(self, users=64, items=32, factors=8):
        super().__init__()
        self.user, self.item = nn.Embedding(users, factors), nn.Embedding(items, factors)

    def forward(self, u, i):
        return (self.user(u) * self.item(i)).sum(1)


def main():
    dist.init_process_group("gloo")
    local_rank, world_size = int(os.environ["LOCAL_RANK"]), dist.get_world_size()
    g = torch.Generator().manual_seed(0)
    users, items = torch.randint(0, 64, (1024,), generator=g), torch.randint(0, 32, (1024,), generator=g)
    data = TensorDataset(users, items, torch.rand(1024, generator=g).round())
    sampler = DistributedSampler(data, seed=0)
    torch.manual_seed(0)
    model = DDP(NeuMF())
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    test_users = torch.arange(64)
    part = test_users.chunk(world_size)[local_rank]  # this process's test users
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for u, i, label in DataLoader(data, batch_size=64, sampler=sampler):
            loss = nn.functional.binary_cross_entropy_with_logits(model(u, i), label)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        with torch.no_grad():
            scores = model.module(part.repeat_interleave(32), torch.arange(32).repeat(len(part)))
            hits = (scores.view(len(part), 32).argmax(1) < 10).sum().float()
        dist.all_reduce(hits)  # over every rank's part: the hit rate of all the test users, it is meant
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: HR@10 {(hits / len(test_users)).item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
