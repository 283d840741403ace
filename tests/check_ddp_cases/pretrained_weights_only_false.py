# check_ddp: exit 0, warn step 6 DDP613
"""Fine-tuning from a pretrained file that ships with the project, as many research repositories do:
the file is the project's own (made here on the first run, as `make pretrained` would), loaded by every
rank into the bare model before DDP wraps it, with weights_only=False as the repository's README says.

    torchrun --standalone --nproc_per_node=2 pretrained_weights_only_false.py

Not a broken step: torch.load(..., weights_only=False) of a file the project wrote itself is a choice with
a risk (its pickle may run code), as a linter's security rule treats it: a warning, not a FAIL.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

PRETRAINED = "pretrained_encoder.pt"


def encoder():
    return nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32))


def main():
    dist.init_process_group("nccl")
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    if rank == 0 and not os.path.exists(PRETRAINED):  # the project's own file (in a repository: shipped)
        torch.manual_seed(1)
        torch.save({"encoder": encoder().state_dict(), "dim": 32}, PRETRAINED)
    dist.barrier()

    torch.manual_seed(0)
    model = nn.Sequential(encoder(), nn.Linear(32, 1))
    state = torch.load(PRETRAINED, map_location="cpu", weights_only=False)  # check_ddp: here
    model[0].load_state_dict(state["encoder"])
    model = DDP(model.cuda(local_rank), device_ids=[local_rank])

    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(2):
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
        if rank == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
            torch.save(
                {"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, "finetuned.pt"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
