# check_ddp: exit 0, warn step 6 DDP607
"""An FSDP2 script that starts from a whole checkpoint (one file, as a single-GPU run saved it) the way
PyTorch's FSDP2 tutorial loads one: rank 0 alone reads the file (memory-mapped, on the CPU), and every
rank calls set_model_state_dict(..., broadcast_from_rank0=True), which sends each rank its shards.

    torchrun --standalone --nproc_per_node=2 fsdp2_rank0_reads_full_checkpoint_ok.py

No mistake: rank 0 alone loads the file, and the broadcast gives every rank the same weights; the others
never hold the whole model.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def layers():
    return nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 1))


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    if rank == 0:  # the whole checkpoint, as a single-GPU run of the same model saved it
        torch.manual_seed(1)
        torch.save({"model": layers().state_dict()}, "pretrained.pt")
    dist.barrier()

    model = layers().to(device)
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    whole = (
        torch.load("pretrained.pt", mmap=True, map_location="cpu", weights_only=True)["model"]
        if rank == 0
        else {}
    )
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    set_model_state_dict(model, whole, options=options)  # every rank: rank 0's tensors, sent out as shards
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
        if rank == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
