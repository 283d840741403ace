# check_ddp: exit 1, FAIL step 8 DDP807
"""A cluster's SLURM template, written for `srun python slurm_own_rendezvous.py`: it makes its own
rendezvous, as a job without torchrun must: the address from the job's first node (or MASTER_ADDR,
where the batch file exports it), a port derived from the job's id, so that two jobs on one node do
not collide, and `init_process_group(init_method="tcp://ADDR:PORT", rank=, world_size=)` from
SLURM's variables. Correct as srun starts it.

Mistake, under torchrun: who the process is comes from SLURM_PROCID, which torchrun does not set
(FAIL step 8). Started as srun starts it, its own address, port and ranks are its launcher's way to
meet, and nothing else is wrong.
"""

import os
import subprocess

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def first_node():
    if "MASTER_ADDR" in os.environ:
        return os.environ["MASTER_ADDR"]
    hosts = subprocess.run(
        ["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]], capture_output=True, text=True
    )
    return hosts.stdout.split()[0]


def setup():
    rank = int(os.environ["SLURM_PROCID"])  # check_ddp: here
    world_size = int(os.environ["SLURM_NTASKS"])
    local_rank = int(os.environ["SLURM_LOCALID"])
    os.environ["MASTER_ADDR"] = first_node()
    os.environ["MASTER_PORT"] = str(15000 + int(os.environ["SLURM_JOB_ID"]) % 10000)
    torch.cuda.set_device(local_rank)
    dist.init_process_group(
        "nccl",
        init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=rank,
        world_size=world_size,
    )
    return rank, local_rank, world_size


def main():
    rank, local_rank, world_size = setup()
    g = torch.Generator().manual_seed(7)
    x = torch.randn(256, 8, generator=g)
    data = TensorDataset(x, (x.sum(1) > 0).long())
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=7)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(7)
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
            torch.save(
                {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                "model.pt",
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
