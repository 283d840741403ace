# check_ddp: exit 1, FAIL step 8 DDP807, FAIL step 3 DDP305
"""An HPC-centre style script, meant for `srun` (one task per GPU) inside an sbatch file that
exports the rendezvous address:

    #SBATCH --ntasks-per-node=2
    export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
    export MASTER_PORT=29512
    srun python h1_slurm_env_no_set_epoch.py

and here started as `torchrun --standalone --nproc_per_node=2 h1_slurm_env_no_set_epoch.py`.

Mistakes: (1) FAIL step 8: init_distributed() takes rank, local rank and world size from
SLURM_PROCID, SLURM_LOCALID and SLURM_NTASKS only, never from torchrun's RANK/LOCAL_RANK/
WORLD_SIZE, so under torchrun it raises KeyError: 'SLURM_PROCID' on every process (the script
is written for another launcher). (2) FAIL step 3, which a correct srun launch shows: the
DistributedSampler shuffles, but the epoch loop never calls sampler.set_epoch(epoch), so each
epoch repeats the first one's order.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def init_distributed():
    rank = int(os.environ["SLURM_PROCID"])
    local_rank = int(os.environ["SLURM_LOCALID"])
    world_size = int(os.environ["SLURM_NTASKS"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    # MASTER_ADDR / MASTER_PORT are exported by the sbatch script
    dist.init_process_group(
        backend="nccl" if device.type == "cuda" else "gloo",
        init_method="env://",
        rank=rank,
        world_size=world_size,
    )
    return rank, local_rank, world_size, device


def make_set(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 6, generator=g)  # 3 channels, 6 time steps
    y = (x.mean(dim=(1, 2)) > 0).long()
    return TensorDataset(x, y)


class Conv1dNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 8, kernel_size=3)
        self.out = nn.Linear(8 * 4, 2)

    def forward(self, x):
        return self.out(F.relu(self.conv(x)).flatten(1))


def main():
    rank, local_rank, world_size, device = init_distributed()

    train_set, val_set = make_set(768, 31), make_set(128, 32)
    sampler = DistributedSampler(train_set, num_replicas=world_size, rank=rank, shuffle=True, seed=31)
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    val_loader = DataLoader(Subset(val_set, range(rank, len(val_set), world_size)), batch_size=64)

    torch.manual_seed(31)
    model = DDP(Conv1dNet().to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    for epoch in range(3):
        model.train()
        s = torch.zeros(4, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            s[0] += loss.detach() * len(y)
            s[1] += len(y)
        model.eval()
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                s[2] += (model.module(x).argmax(1) == y).sum()
                s[3] += len(y)
        dist.all_reduce(s)
        if rank == 0:
            print(
                f"epoch {epoch} train_loss={(s[0] / s[1]).item():.4f} val_acc={(s[2] / s[3]).item():.3f}",
                flush=True,
            )
            torch.save(
                {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                "h1_ckpt.pt",
            )

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
