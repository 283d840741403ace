# check_ddp: exit 1, FAIL step 6 DDP609, see fsdp_step6_sharded_state_dict_saved_by_rank_zero
"""An FSDP2 script that moved to torch.distributed.checkpoint, but kept its save where the single-GPU
script had it: under `if rank == 0:`.

    torchrun --standalone --nproc_per_node=2 fsdp2_dcp_save_on_rank0.py

Mistake: dcp.save is a collective (the ranks agree on a plan, then each writes its own shards), and only
rank 0 calls it: it waits for the others, which go on to their next collective. Every rank calls dcp.save;
rank 0 writes the folder's index by itself.
"""

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict
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
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    data = TensorDataset(x, torch.tanh(x.sum(1, keepdim=True) / 4))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        totals = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(x), torch.tensor(float(len(x)), device=device)])
        dist.all_reduce(totals)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
            state = {"model": get_model_state_dict(model)}
            dcp.save(state, checkpoint_id=f"ckpt/epoch_{epoch}")  # check_ddp: here
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
