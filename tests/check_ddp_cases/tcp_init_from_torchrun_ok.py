# check_ddp: exit 0
"""A research codebase's `init_distributed()`, written to work under torchrun and under its own
launch alike: it builds an explicit `init_method="tcp://MASTER_ADDR:MASTER_PORT"` from the
environment, and passes rank and world size from RANK and WORLD_SIZE. Under torchrun those are
torchrun's own: the ranks meet at torchrun's store, as with the default env://. Correct.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def init_distributed():
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    url = f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl", init_method=url, rank=rank, world_size=world_size)
    return rank, local_rank, world_size


def main():
    rank, local_rank, world_size = init_distributed()
    g = torch.Generator().manual_seed(9)
    x = torch.randn(256, 8, generator=g)
    data = TensorDataset(x, (x.sum(1) > 0).long())
    sampler = DistributedSampler(data, shuffle=True, seed=9)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(9)
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
