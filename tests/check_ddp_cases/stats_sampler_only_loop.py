# check_ddp: exit 0
"""A script that first walks its data to compute the normalisation statistics (mean and std, each rank
over its shard, all-reduced), with no model involved, then trains. GPU only.

    torchrun --standalone --nproc_per_node=2 stats_sampler_only_loop.py

Correct. The statistics loop goes over a DataLoader with no model: not an evaluation.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def shard_statistics(dataset, device):
    loader = DataLoader(dataset, batch_size=256, sampler=DistributedSampler(dataset, shuffle=False))
    sums = torch.zeros(3, device=device)
    for x, _ in loader:
        x = x.to(device)
        sums += torch.stack([x.sum(), (x * x).sum(), torch.tensor(float(x.numel()), device=device)])
    dist.all_reduce(sums)
    mean = sums[0] / sums[2]
    return mean, (sums[1] / sums[2] - mean**2).sqrt()


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl", device_id=device)
    g = torch.Generator().manual_seed(9)
    x = 3 + 2 * torch.randn(1024, 8, generator=g)
    dataset = TensorDataset(x, (x[:, 0] > 3).float().unsqueeze(1))
    mean, std = shard_statistics(dataset, device)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler)
    torch.manual_seed(9)
    model = DDP(
        nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device),
        device_ids=[local_rank],
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        totals = torch.zeros(2, device=device)
        for xb, yb in loader:
            xb, yb = (xb.to(device) - mean) / std, yb.to(device)
            loss = nn.functional.binary_cross_entropy_with_logits(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(xb), torch.tensor(float(len(xb)), device=device)])
        dist.all_reduce(totals)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
    if dist.get_rank() == 0:
        torch.save(
            {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "mean": mean,
                "std": std,
            },
            "model.pt",
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
