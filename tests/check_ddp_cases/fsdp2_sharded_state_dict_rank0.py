# check_ddp: exit 1, FAIL step 6 DDP614, see fsdp_step6_sharded_state_dict_saved_by_rank_zero
"""A learner's FSDP2 script that saves the model as the DDP lesson did, model.state_dict() on rank 0.

    torchrun --standalone --nproc_per_node=2 fsdp2_sharded_state_dict_rank0.py

Mistake: a sharded model's state_dict() holds DTensors: the full shapes, and this rank's rows only. The
file rank 0 writes is half of each parameter; torch.load refuses it with weights_only=True, and no
single-GPU script can load it.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def data(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    return TensorDataset(x, torch.tanh(x @ torch.ones(16, 1) / 4))


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 1)).to(
        device
    )
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)  # after sharding: the shards

    train_set, val_set = data(1024, 0), data(256, 1)
    sampler = DistributedSampler(train_set, seed=0)
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        model.train()
        totals = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(x), torch.tensor(float(len(x)), device=device)])
        model.eval()
        val = torch.zeros(2, device=device)
        with torch.no_grad():  # every rank: the sharded forward all-gathers, with every rank
            for start in range(rank * 64, len(val_set), world * 64):
                x, y = (t.to(device) for t in val_set[start : start + 64])
                val += torch.stack(
                    [nn.functional.mse_loss(model(x), y, reduction="sum"), torch.tensor(64.0, device=device)]
                )
        dist.all_reduce(totals)
        dist.all_reduce(val)
        if rank == 0:
            state = model.state_dict()
            loss, val_loss = (totals[0] / totals[1]).item(), (val[0] / val[1]).item()
            print(f"epoch {epoch}: loss {loss:.4f}, val {val_loss:.4f}")
            torch.save({"model": state, "epoch": epoch + 1}, "fsdp_model.pt")  # check_ddp: here
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
