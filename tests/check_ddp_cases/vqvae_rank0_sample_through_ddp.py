# check_ddp: exit 1, FAIL step 10 DDP1001
"""An autoencoder's training script, in the style of VQ-VAE repositories: a convolutional model with
BatchNorm, a DistributedSampler, the loss all-reduced every epoch, and after each epoch rank 0
reconstructing a few images to look at, saved as sample_N.pt.

    torchrun --standalone --nproc_per_node=2 vqvae_rank0_sample_through_ddp.py

Mistake: rank 0 reconstructs its samples through the DDP model, model(x), alone. DDP's forward
syncs the model's buffers (BatchNorm's running statistics) from rank 0 first: a collective the other
ranks never make. Rank 0's calls are then one ahead of the others': its next broadcast meets their
next all-reduce, of another size, and gloo aborts the job ("Received data size doesn't match expected
size"); nccl would hang or corrupt. The fix: reconstruct with the bare model, model.module.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def autoencoder():
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.Conv2d(16, 1, 3, padding=1),
    )  # fmt: skip


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank, device = dist.get_rank(), torch.device("cuda", local_rank)
    g = torch.Generator().manual_seed(4)
    images = torch.randn(128, 1, 12, 12, generator=g)
    sampler = DistributedSampler(TensorDataset(images), seed=4)
    loader = DataLoader(TensorDataset(images), batch_size=16, sampler=sampler)
    torch.manual_seed(4)
    model = DDP(autoencoder().to(device), device_ids=[local_rank])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=device)
        for (x,) in loader:
            x = x.to(device)
            loss = F.mse_loss(model(x), x)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach() * len(x), torch.tensor(float(len(x)), device=device)])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: loss {(total[0] / total[1]).item():.4f}", flush=True)
            model.eval()
            with torch.no_grad():
                sample = model(images[:4].to(device))  # check_ddp: here
            model.train()
            torch.save(sample.cpu(), f"sample_{epoch}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
