# check_ddp: exit 1, FAIL step 10 DDP1001
"""An image classifier as a GPU vendor's blog post trains it: DDP, a DistributedSampler, the epoch's numbers
printed by rank 0, then a test on rank 0 while the others wait at a barrier before the end.

    torchrun --standalone --nproc_per_node=2 blog_rank0_test_then_barrier.py

Mistake: rank 0 tests through the DDP model, whose forward broadcasts its BatchNorm buffers to every
rank, while rank 1 waits in dist.barrier(): a broadcast and a barrier, paired, never finish. The job
hangs (on gloo as on nccl) until the process group's timeout.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("nccl")
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(768, 3, 8, 8, generator=g)
    y = (x.mean((1, 2, 3)) > 0).long()
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 36, 2))
    model = DDP(net.cuda(local_rank), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        model.train()
        totals = torch.zeros(2, device=local_rank)
        for xb, yb in loader:
            xb, yb = xb.cuda(local_rank), yb.cuda(local_rank)
            loss = nn.functional.cross_entropy(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(xb), torch.tensor(float(len(xb)), device=local_rank)])
        dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
    if rank == 0:
        model.eval()
        with torch.no_grad():
            accuracy = (
                (model(x[:256].cuda(local_rank)).argmax(1).cpu() == y[:256]).float().mean()  # check_ddp: here
            )
        print(f"test accuracy {accuracy.item():.3f}")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
