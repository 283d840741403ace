# check_ddp: exit 1, FAIL step 3 DDP302, see step3_unseeded_dataset
"""A training script of the HPC-course kind: the seed set per rank "so that the ranks augment
differently", then the data split into train, validation and test with random_split, a
DistributedSampler on the training split.

    torchrun --standalone --nproc_per_node=2 hpc_split_seeded_by_rank.py

Mistake: the generator is seeded by rank before random_split, so each rank splits the data its own way:
the training shards the DistributedSampler deals are parts of different training sets (some samples
never trained on, others twice, and test samples trained on by another rank).
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset, random_split
from torch.utils.data.distributed import DistributedSampler


def main(seed=42):
    dist.init_process_group("nccl")
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1200, 12, generator=g)
    dataset = TensorDataset(x, (x[:, :3].sum(1, keepdim=True) > 0).float())
    torch.random.manual_seed(seed + rank)
    train_set, val_set, test_set = random_split(dataset, [960, 120, 120])
    sampler = DistributedSampler(train_set)
    loader = DataLoader(train_set, batch_size=48, sampler=sampler)  # check_ddp: here
    model = DDP(
        nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 1)).cuda(local_rank),
        device_ids=[local_rank],
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        totals = torch.zeros(2, device=local_rank)
        for xb, yb in loader:
            xb, yb = xb.cuda(local_rank), yb.cuda(local_rank)
            loss = nn.functional.binary_cross_entropy_with_logits(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(xb), torch.tensor(float(len(xb)), device=local_rank)])
        dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
