# check_ddp: exit 1, FAIL step 8 DDP807
"""An HPC centre's tutorial script, written for `mpirun -np N python hpc_mpi_rank.py`: who each process
is comes from MPI (mpi4py, Open MPI's OMPI_COMM_WORLD_LOCAL_RANK), and a try/except lets it also run as
a single process on a laptop.

    mpirun -np 2 python hpc_mpi_rank.py        # as its authors run it

Mistake, under torchrun: the MPI lookup fails, the except branch makes every process "rank 0 of 1", no
process group is made, and the N processes each train the whole job alone, without a word.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

try:
    from mpi4py import MPI  # check_ddp: here

    local_rank = int(os.environ["OMPI_COMM_WORLD_LOCAL_RANK"])
    rank, size = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
    with_ddp = True
except Exception as error:  # a laptop: one process
    print(f"MPI not available ({error}): running as a single process")
    local_rank, rank, size, with_ddp = 0, 0, 1, False

device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
if with_ddp:
    dist.init_process_group("nccl", rank=rank, world_size=size)

g = torch.Generator().manual_seed(0)
x = torch.randn(512, 6, generator=g)
dataset = TensorDataset(x, x.norm(dim=1, keepdim=True))
sampler = DistributedSampler(dataset, num_replicas=size, rank=rank)
loader = DataLoader(dataset, batch_size=32, sampler=sampler)
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(6, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
if with_ddp:
    model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
optimizer = torch.optim.SGD(model.parameters(), lr=0.02)
for epoch in range(3):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        loss = nn.functional.mse_loss(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    if rank == 0:
        print(f"epoch {epoch}: loss {loss.item():.4f}")
