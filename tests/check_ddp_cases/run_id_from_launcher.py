# check_ddp: exit 1, FAIL step 8 DDP000
"""A lab's training script that names each run's folder after its launcher's job id, as a number:
SLURM's SLURM_JOB_ID under srun, torchrun's TORCHELASTIC_RUN_ID otherwise.

    torchrun --standalone --nproc_per_node=2 run_id_from_launcher.py

Mistake: torchrun's run id is no number ("none" unless --rdzv-id is given, a random hexadecimal id
with --standalone): under torchrun every process stops with ValueError before its process group,
on a line that reads the launcher's variable. It works under srun only.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def run_folder():
    if os.environ.get("TORCHELASTIC_RUN_ID") is not None:  # under torchrun
        job_id = int(os.environ["TORCHELASTIC_RUN_ID"])  # check_ddp: here
    else:
        job_id = int(os.environ["SLURM_JOB_ID"])
    folder = f"runs/{job_id:08d}"
    os.makedirs(folder, exist_ok=True)
    return folder


def main():
    folder = run_folder()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(256, 8, generator=g)
    data = TensorDataset(x, (x.sum(1) > 0).long())
    sampler = DistributedSampler(data, shuffle=True, seed=3)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(3)
    model = DDP(nn.Linear(8, 2).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device="cuda")
        for xb, yb in loader:
            xb, yb = xb.cuda(), yb.cuda()
            optimizer.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach() * len(yb), torch.tensor(float(len(yb)), device="cuda")])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} loss {(total[0] / total[1]).item():.4f}", flush=True)
            torch.save(
                {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
                f"{folder}/model.pt",
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
