# check_ddp: exit 1, FAIL step 2 DDP000
"""A diffusion model's training script written for torch.distributed.launch, in the style of small
DDPM repositories: `--local_rank` from the command line (default -1) names the GPU as a string,
`f"cuda:{args.local_rank}"`, and the model moves there inside the model's own class.
GPU only.

    python -m torch.distributed.launch --nproc_per_node=2 diffusion_cuda_minus_one_string.py  # written for

Mistake: torchrun passes no --local_rank: every process keeps -1, and torch refuses the device string
"cuda:-1" ("Invalid device string") in the script's own .to(device). Seen on a real script (FutureXiang/ddae,
where the stand-in once took torch's refusal for its own error: the check said it was incomplete).

What the check says: the script's own error, at its line (step 2), never the check's own. Not yet
said: that its root is step 8's --local_rank (DDP805), as for `.cuda(args.local_rank)`: here the
default reaches .to() through a variable passed into another function, which DDP805 does not follow.
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser(description="DDPM training")
parser.add_argument("--local_rank", default=-1, type=int, help="set by torch.distributed.launch")
parser.add_argument("--epochs", default=2, type=int)


class DDPM(nn.Module):
    def __init__(self, nn_model, device):
        super().__init__()
        self.nn_model = nn_model.to(device)  # check_ddp: here

    def forward(self, x):
        noise = torch.randn_like(x)
        return nn.functional.mse_loss(self.nn_model(x + noise), noise)


def main():
    args = parser.parse_args()
    dist.init_process_group(backend="nccl")
    device = f"cuda:{args.local_rank}"  # a string, as the script passes it to .to()
    model = DDPM(nn.Sequential(nn.Linear(16, 32), nn.SiLU(), nn.Linear(32, 16)), device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank])
    data = TensorDataset(torch.randn(256, 16, generator=torch.Generator().manual_seed(0)))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for (x,) in loader:
            loss = model(x.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
