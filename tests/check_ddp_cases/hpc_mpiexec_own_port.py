# check_ddp: exit 1, FAIL step 8 DDP807
"""A research code base's training script, written for MPICH's `mpiexec -n 2 python
hpc_mpiexec_own_port.py`: who each process is comes from PMI_RANK and PMI_SIZE (1 and 0 where they
are missing, as on a laptop), and the script sets the rendezvous address itself, as a job under
mpiexec must (mpiexec, unlike torchrun, runs no store).

Mistake: launched with torchrun, every process finds no PMI_RANK and takes itself for rank 0 of a job
of one, on a port of the script's where nothing listens: the ranks never meet (its MASTER_PORT, over
torchrun's, is what a check sees first). The cause is one: the script is written for another
launcher (FAIL step 8); its own MASTER_PORT is that launcher's way to meet, and follows from it. Run
as mpiexec starts it, the rest is right.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def setup():
    rank = int(os.environ.get("PMI_RANK", 0))  # check_ddp: here
    world_size = int(os.environ.get("PMI_SIZE", 1))
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29517"
    local_rank = rank % torch.cuda.device_count()
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    return rank, local_rank


def main():
    rank, local_rank = setup()
    g = torch.Generator().manual_seed(11)
    x = torch.randn(256, 8, generator=g)
    data = TensorDataset(x, (x.sum(1) > 0).long())
    sampler = DistributedSampler(data, shuffle=True, seed=11)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(11)
    model = DDP(nn.Linear(8, 2).cuda(local_rank), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=f"cuda:{local_rank}")
        for xb, yb in loader:
            xb, yb = xb.cuda(local_rank), yb.cuda(local_rank)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach() * len(yb), torch.tensor(float(len(yb)), device=total.device)])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} loss {(total[0] / total[1]).item():.4f}", flush=True)
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
            torch.save(state, "model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
