# check_ddp: exit 1, FAIL step 8 DDP807
"""An HPC centre's example for `srun`, which finds its rendezvous host itself, from the job's node list,
and refuses to start outside a SLURM job with a message of its own:

    #SBATCH --nodes=1 --ntasks-per-node=2
    srun python hpc_nodelist_checked_in_try.py

and here started as `torchrun --standalone --nproc_per_node=2 hpc_nodelist_checked_in_try.py`.

Mistake: FAIL step 8: the first variable it reads of its launcher is SLURM_JOB_NODELIST, inside a try
whose `except KeyError` raises the script's own error ("not inside a SLURM job"): srun sets it,
torchrun does not, so under torchrun every process stops in that handler, before who it is
(SLURM_PROCID) is read: the script is written for another launcher. Run as srun starts it, the rest
is right: the sampler's set_epoch, the loss all-reduced, rank 0 saving the bare model.
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


def first_host(nodelist):
    """The first host of a SLURM node list: scontrol expands it where there is one."""
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True)
        return out.stdout.split()[0]
    except (FileNotFoundError, IndexError):
        return nodelist.split(",")[0]


def setup():
    try:
        nodelist = os.environ["SLURM_JOB_NODELIST"]  # check_ddp: here
        rank = int(os.environ["SLURM_PROCID"])
        world_size = int(os.environ["SLURM_NTASKS"])
        local_rank = int(os.environ["SLURM_LOCALID"])
    except KeyError as missing:  # outside a SLURM job
        message = f"not inside a SLURM job ({missing} is not set): submit with sbatch"
        raise RuntimeError(message) from None
    os.environ.setdefault("MASTER_ADDR", first_host(nodelist))
    os.environ.setdefault("MASTER_PORT", "29531")
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
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
            state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}
            torch.save(state, "model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
