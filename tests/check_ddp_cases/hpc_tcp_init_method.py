# check_ddp: exit 1, FAIL step 1 DDP105, see step1_hardcoded_master_port
"""An HPC centre's example, launched with torchrun but keeping the rendezvous of its mp.spawn days:
init_process_group(init_method="tcp://127.0.0.1:29411") with RANK and WORLD_SIZE read from torchrun.
CPU code (gloo), as the centre's login nodes run it.

    torchrun --standalone --nproc_per_node=2 hpc_tcp_init_method.py

Mistake: the ranks meet at a port the script chose, not where torchrun's job meets: a second job on
the node (or a second node) takes the same port, and the jobs hang or meet each other's processes.
Leave init_method out: its default, env://, reads MASTER_ADDR and MASTER_PORT from torchrun.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29411", rank=rank, world_size=world_size)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 8, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        total = torch.zeros(2)
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach() * len(xb), torch.tensor(float(len(xb)))])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: loss {(total[0] / total[1]).item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
