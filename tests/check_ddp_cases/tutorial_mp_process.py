# check_ddp: exit 1, FAIL step 8 DDP801
"""The point-to-point and all-reduce tutorial of the PyTorch docs ("Writing Distributed Applications"),
grown into a small training job: init_process() sets MASTER_ADDR/MASTER_PORT and makes the group, run()
trains, and the main block starts one torch.multiprocessing.Process per rank itself.

    python tutorial_mp_process.py        # as its author runs it

Mistake: launched with torchrun, as the guide says, every torchrun worker starts a job of its own: 2 x 2
processes, two pairs of rank 0 and rank 1 meeting at one port.
"""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def run(rank, size):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    sampler = DistributedSampler(data, num_replicas=size, rank=rank)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        print(f"Rank {rank}, epoch {epoch}: loss {loss.item():.4f}")


def init_process(rank, size, fn, backend="gloo"):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29533"
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size)
    dist.destroy_process_group()


if __name__ == "__main__":
    world_size = 2
    processes = []
    mp.set_start_method("spawn", force=True)
    for rank in range(world_size):
        p = mp.Process(target=init_process, args=(rank, world_size, run))
        p.start()  # check_ddp: here
        processes.append(p)
    for p in processes:
        p.join()
