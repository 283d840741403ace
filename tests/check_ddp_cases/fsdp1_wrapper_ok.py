# check_ddp: exit 0, ok step 4, ok step 6
"""A model trained with FSDP1, the wrapper class, as scripts written before FSDP2 read (and as many
libraries still do): FullyShardedDataParallel(model, device_id=...), the optimizer after the wrap, a
DistributedSampler, the loss all-reduced, the full state dict saved by rank 0 through the wrapper's own
FULL_STATE_DICT context, entered on every rank.

    torchrun --standalone --nproc_per_node=2 fsdp1_wrapper_ok.py

No mistake: one copy of the weights, sharded over the ranks (FULL_SHARD), gathered on every rank to save.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import FullStateDictConfig, StateDictType
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("nccl")
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))
    model = FSDP(model, device_id=torch.cuda.current_device())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(1024, 16, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True).sin())
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        totals = torch.zeros(2, device=local_rank)
        for xb, yb in loader:
            xb, yb = xb.cuda(local_rank), yb.cuda(local_rank)
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(xb), torch.tensor(float(len(xb)), device=local_rank)])
        dist.all_reduce(totals)
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, FullStateDictConfig(rank0_only=True)):
            state = model.state_dict()  # a gather, on every rank; rank 0 gets the whole model
        if rank == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
            torch.save({"model": state, "optimizer": optimizer.state_dict(), "epoch": epoch + 1}, "fsdp1.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
