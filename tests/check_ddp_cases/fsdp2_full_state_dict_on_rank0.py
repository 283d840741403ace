# check_ddp: exit 1, FAIL step 6 DDP609, see fsdp_step6_full_state_dict_on_rank_zero
"""A learner's FSDP2 script whose checkpoint code keeps DDP's shape: everything about saving inside
`if rank == 0:`, the full state dict gathered there too.

    torchrun --standalone --nproc_per_node=2 fsdp2_full_state_dict_on_rank0.py

Mistake: get_model_state_dict(..., full_state_dict=True) all-gathers the shards: a collective, which
rank 1 never joins. Rank 0's gather pairs with rank 1's next collective (its next forward's all-gather,
of another size): on gloo the job aborts, "Received data size doesn't match"; on nccl it hangs.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
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
            state = get_model_state_dict(  # check_ddp: here
                model, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
            loss, val_loss = (totals[0] / totals[1]).item(), (val[0] / val[1]).item()
            print(f"epoch {epoch}: loss {loss:.4f}, val {val_loss:.4f}")
            torch.save({"model": state, "epoch": epoch + 1}, "fsdp_model.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
