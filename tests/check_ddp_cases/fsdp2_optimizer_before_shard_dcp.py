# check_ddp: exit 1, FAIL step 4 DDP408, see fsdp_step4_optimizer_before_fully_shard
"""A learner's FSDP2 script that checkpoints with DCP each epoch, as the FSDP2 tutorial does, its
optimizer made before sharding, as a DDP script's is made before (or after) the wrap without harm.

    torchrun --standalone --nproc_per_node=2 fsdp2_optimizer_before_shard_dcp.py

Mistake: fully_shard puts new, sharded parameters in the model's place; the optimizer holds the old ones,
which no forward uses: its steps change nothing the model computes with. Then the save's
get_optimizer_state_dict(model, optimizer) fails (KeyError), looking for the model's parameters in an
optimizer that holds none of them: the same mistake, not a second one.
"""

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    data = TensorDataset(x, torch.tanh(x.sum(1, keepdim=True) / 4))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        totals = torch.zeros(2, device=device)
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = nn.functional.mse_loss(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(xb), torch.tensor(float(len(xb)), device=device)])
        dist.all_reduce(totals)
        state = {
            "model": get_model_state_dict(model),
            "optim": get_optimizer_state_dict(model, optimizer),  # check_ddp: here
        }
        dcp.save(state, checkpoint_id=f"dcp_checkpoints/epoch_{epoch}")
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
