# check_ddp: exit 1, FAIL step 3 DDP305, see step3_missing_set_epoch
"""A course's first DDP exercise: a regression model trained on the CPU with gloo, its update written
out by hand (no torch.optim: `p -= lr * p.grad`, as the course teaches gradient descent first), and a
DistributedSampler that shuffles. CPU code.

    torchrun --standalone --nproc_per_node=2 course_manual_sgd_no_set_epoch.py

Mistake: sampler.set_epoch(epoch) is never called, so the sampler draws the same order every epoch.
(No optimizer step ever runs: a checker must see the training from what the job did, the backward
passes on each loader's batches, not from torch.optim alone.)
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=g)
    data = TensorDataset(x, x @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    lr = 0.05
    for epoch in range(3):
        total = torch.zeros(2)
        for xb, yb in loader:
            loss = nn.functional.mse_loss(model(xb), yb)
            model.zero_grad()
            loss.backward()
            with torch.no_grad():
                for p in model.parameters():
                    p -= lr * p.grad
            total += torch.stack([loss.detach() * len(xb), torch.tensor(float(len(xb)))])
        dist.all_reduce(total)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: mse {(total[0] / total[1]).item():.5f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
