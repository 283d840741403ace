# check_ddp: exit 1, FAIL step 8 DDP807, FAIL step 3 DDP305
"""A lab's SLURM script, written for `srun` inside a batch file that asks for CPUs per task and
exports the rendezvous address:

    #SBATCH --ntasks-per-node=2 --cpus-per-task=4
    export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1) MASTER_PORT=29512
    srun python slurm_cpus_read_first.py

and here started as `torchrun --standalone --nproc_per_node=2 slurm_cpus_read_first.py`.

Mistakes: (1) FAIL step 8: the first thing it reads of its launcher is SLURM_CPUS_PER_TASK (for its
threads), before who the process is (SLURM_PROCID): a variable srun sets and torchrun does not, so
under torchrun every process stops there with KeyError: the script is written for another launcher.
(2) FAIL step 3, which a launch as srun's shows: the sampler shuffles, but no set_epoch(epoch).
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
    torch.set_num_threads(int(os.environ["SLURM_CPUS_PER_TASK"]))  # check_ddp: here
    rank = int(os.environ["SLURM_PROCID"])
    world_size = int(os.environ["SLURM_NTASKS"])
    local_rank = int(os.environ["SLURM_LOCALID"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
    return rank, local_rank, world_size


def main():
    rank, local_rank, world_size = setup()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(256, 8, generator=g)
    data = TensorDataset(x, (x.sum(1) > 0).long())
    sampler = DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=5)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(5)
    model = DDP(nn.Linear(8, 2).cuda(local_rank), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
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
