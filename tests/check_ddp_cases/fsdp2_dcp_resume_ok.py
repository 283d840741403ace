# check_ddp: exit 0
"""An FSDP2 script as torchtitan and PyTorch's FSDP2 tutorial checkpoint: every rank saves its own shards
with torch.distributed.checkpoint (DCP) each epoch, and a restart loads them back (resharded to the new
world size, if it changed) into the sharded model and its optimizer, by name; the whole run in one launch
here (it trains, saves, then resumes from what it saved into a fresh model).

    torchrun --standalone --nproc_per_node=2 fsdp2_dcp_resume_ok.py

No mistake: dcp.save and dcp.load are collectives that every rank calls, each writing and reading its
own shards; rank 0 writes the folder's index.
"""

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def build(device):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1)).to(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def train(model, optimizer, loader, sampler, device, epochs, folder):
    for epoch in epochs:
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
        model_sd, optim_sd = get_state_dict(model, optimizer)  # this rank's shards, keyed by name
        dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=os.path.join(folder, f"epoch_{epoch}"))
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    data = TensorDataset(x, torch.tanh(x.sum(1, keepdim=True) / 4))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)

    model, optimizer = build(device)
    train(model, optimizer, loader, sampler, device, range(2), "dcp_checkpoints")
    # a restart: a fresh model, its state loaded from the last epoch's shards, on every rank
    model, optimizer = build(device)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id="dcp_checkpoints/epoch_1")
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    train(model, optimizer, loader, sampler, device, range(2, 3), "dcp_checkpoints")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
