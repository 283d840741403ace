# check_ddp: exit 0
"""A diffusion model's training script in the style of DiT's train.py: an EMA copy of the model made
with deepcopy once the model is on its GPU, a noise schedule, requires_grad_(False) on the EMA, rank 0
saving model, EMA and optimizer, and a sample drawn at the end with a GPU's own random generator,
torch.Generator(device=device). GPU only.

    torchrun --standalone --nproc_per_node=2 dit_generator_and_ema_ok.py

Correct. Two things a checker must not get wrong here: a GPU generator is CUDA's own (without a GPU it
cannot be made: not checked, never the script's error), and a model the checker watches must copy and
pickle as the script made it (the EMA copy carries nothing of the checker's).
"""

import os
from copy import deepcopy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Denoiser(nn.Module):
    def __init__(self, dim=16):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim + 1, 64), nn.SiLU(), nn.Linear(64, dim))

    def forward(self, x, t):
        return self.net(torch.cat([x, t[:, None].float() / 100], dim=1))


@torch.no_grad()
def update_ema(ema_model, model, decay=0.999):
    ema_params = dict(ema_model.named_parameters())
    for name, param in model.named_parameters():
        ema_params[name].mul_(decay).add_(param.data, alpha=1 - decay)


def main():
    dist.init_process_group("nccl")
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    torch.manual_seed(rank)  # each rank its own noise, as DiT seeds it

    model = Denoiser().to(device)
    ema = deepcopy(model).to(device)  # the EMA copy: no DDP hooks, no optimizer
    ema.requires_grad_(False)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(512, 16, generator=g))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    betas = torch.linspace(1e-4, 0.02, 100, device=device)
    alphas = torch.cumprod(1 - betas, dim=0)

    for epoch in range(2):
        sampler.set_epoch(epoch)
        running, count = torch.zeros((), device=device), 0
        for (x0,) in loader:
            x0 = x0.to(device)
            t = torch.randint(0, 100, (len(x0),), device=device)
            noise = torch.randn_like(x0)
            a = alphas[t][:, None]
            loss = nn.functional.mse_loss(model(a.sqrt() * x0 + (1 - a).sqrt() * noise, t), noise)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            update_ema(ema, model.module)
            running += loss.detach() * len(x0)
            count += len(x0)
        totals = torch.stack([running, running.new_tensor(count)])
        dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
            checkpoint = {
                "model": model.module.state_dict(),
                "ema": ema.state_dict(),
                "opt": optimizer.state_dict(),
            }
            torch.save(checkpoint, "dit_checkpoint.pt")

    if rank == 0:  # a sample from the EMA model, with a GPU's own generator, as DiT's sample.py draws
        generator = torch.Generator(device=device).manual_seed(0)
        z = torch.randn(4, 16, device=device, generator=generator)
        print("sample norm", ema(z, torch.zeros(4, dtype=torch.long, device=device)).norm().item())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
