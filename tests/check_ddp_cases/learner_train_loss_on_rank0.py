# check_ddp: exit 0, warn step 5 DDP506
"""A learner's own conversion of a course script: a DataLoader with a DistributedSampler, a running loss
printed each epoch, a held-out evaluation whose sums are all-reduced, a checkpoint by rank 0.

    torchrun --standalone --nproc_per_node=2 learner_train_loss_on_rank0.py

Mistake: the training loss is summed on each rank (loss.item() each batch) and printed by rank 0 as the
epoch's loss, never all-reduced: it is rank 0's own shard's, an estimate. Only the held-out sums are
all-reduced, which is DDP step 10's, not the metrics' of DDP step 5.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x[:, :1] * 2 - x[:, 1:2]) + 0.05 * torch.randn(n, 1, generator=g))


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    train_set, val_set = dataset(1024, 0), dataset(256, 1)
    sampler = DistributedSampler(train_set, seed=0)
    loader = DataLoader(train_set, batch_size=32, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1)).to(device))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        running_loss = 0.0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running_loss += loss.item()  # check_ddp: here
        model.eval()
        val_sum, val_count = torch.zeros((), device=device), 0
        with torch.no_grad():
            for i in range(dist.get_rank(), len(val_set), dist.get_world_size()):
                x, y = (t.to(device) for t in val_set[i : i + 1])
                val_sum += nn.functional.mse_loss(model.module(x), y, reduction="sum")
                val_count += 1
        totals = torch.stack([val_sum, val_sum.new_tensor(val_count)])
        dist.all_reduce(totals)
        model.train()
        if dist.get_rank() == 0:
            val = (totals[0] / totals[1]).item()
            print(f"epoch {epoch}: loss {running_loss / len(loader):.4f}, val {val:.4f}")
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, "ckpt.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
