# check_ddp: exit 0, warn step 6 DDP601, see step6_unsafe_torch_load
"""Fine-tuning from weights fetched into a cache in /tmp, as scripts that call a hub or a download
helper do: a helper process fetches the file (here: writes it) into the shared temporary folder, and every
rank loads it with weights_only=False.

    torchrun --standalone --nproc_per_node=2 hub_cache_weights_only_false.py

Mistake: /tmp is a folder every user of the machine may write to, and the job did not write this file
itself: anyone could have put it there first, or replaced it. torch.load(..., weights_only=False) runs
whatever its pickle names, on every rank.
"""

import os
import subprocess
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

FETCH = "import sys, torch; torch.manual_seed(1); torch.save(torch.nn.Linear(8, 8).state_dict(), sys.argv[1])"


def main():
    dist.init_process_group("nccl")
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    cached = os.path.join(tempfile.gettempdir(), f"hub_cache_{os.getppid()}_linear.pt")
    if rank == 0:
        subprocess.run([sys.executable, "-c", FETCH, cached], check=True)  # the download, by another process
    dist.barrier()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    model[0].load_state_dict(torch.load(cached, map_location="cpu", weights_only=False))  # check_ddp: here
    model = DDP(model.cuda(local_rank), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for _ in range(8):
        x = torch.randn(32, 8, generator=g).cuda(local_rank)
        loss = model(x).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    dist.barrier()
    if rank == 0:
        os.remove(cached)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
