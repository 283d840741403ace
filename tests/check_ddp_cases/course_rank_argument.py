# check_ddp: exit 1, FAIL step 8 DDP805
"""A systems course's assignment (part 3: distributed data parallel): the rank, the world size and the
master's address are given on the command line, one command per machine, and the process group is
told them. CPU only, gloo, as the course's cluster had no GPUs.

    python course_rank_argument.py --rank 0 --world-size 2     # on the first machine, as the course runs it

Mistake: under torchrun every process gets the same command line: all claim rank 0.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", type=int, default=0, help="rank of this machine (default: 0)")
    parser.add_argument("--world-size", type=int, default=2, help="machines in the job (default: 2)")
    args = parser.parse_args()  # check_ddp: here
    dist.init_process_group("gloo", rank=args.rank, world_size=args.world_size)
    g = torch.Generator().manual_seed(744)
    x = torch.randn(256, 8, generator=g)
    data = TensorDataset(x, (x.sum(1) > 0).long())
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(744)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = nn.functional.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
