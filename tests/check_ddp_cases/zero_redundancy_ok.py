# check_ddp: exit 0
"""A language-model fine-tuning script from a company's distributed-training guide: the optimizer's state
sharded across ranks with ZeroRedundancyOptimizer, GPU memory logged from torch.cuda.memory_stats(), the
optimizer consolidated on rank 0 before the checkpoint. GPU only.

    torchrun --standalone --nproc_per_node=2 zero_redundancy_ok.py

Correct.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def get_mem_stats(device):
    mem = torch.cuda.memory_stats(device)
    return {
        "curr_alloc_gb": 1e-9 * mem["allocated_bytes.all.current"],
        "peak_alloc_gb": 1e-9 * mem["allocated_bytes.all.peak"],
    }


def main():
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}")
    torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl", device_id=device)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 64, (384, 16), generator=g)
    data = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    sampler = DistributedSampler(data, shuffle=True, drop_last=True)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 64)).to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank])
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, lr=3e-3)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        running = torch.zeros(2, device=device)
        for inputs, labels in loader:
            inputs, labels = inputs.to(device), labels.to(device)
            loss = nn.functional.cross_entropy(model(inputs).flatten(0, 1), labels.flatten())
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            running += torch.stack(
                [loss.detach() * labels.numel(), torch.tensor(float(labels.numel()), device=device)]
            )
        dist.all_reduce(running)
        if rank == 0:
            print(f"epoch {epoch}: loss {(running[0] / running[1]).item():.3f}", get_mem_stats(device))
    optimizer.consolidate_state_dict(to=0)  # every rank: a collective
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, "checkpoint.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
