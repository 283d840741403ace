# check_ddp: exit 1, FAIL step 1 DDP104
"""A notebook-turned-script of the competition kind, half converted: it reads who it is from torchrun
(RANK, WORLD_SIZE, LOCAL_RANK), takes its own rows of the data by rank, and trains.

    torchrun --standalone --nproc_per_node=2 kaggle_ranks_train_alone.py

Mistake: no process group is made (DDP step 1), and so nothing can wrap the model: the two processes
never exchange a thing. Each trains a model of its own on half the rows, and rank 0 saves its
half-trained model as the job's. What the ranks do apart (no DDP, no metric reduced) follows from it.
"""

import os

import torch
import torch.nn as nn

RANK, WORLD, LOCAL_RANK = (
    int(os.environ["RANK"]),
    int(os.environ["WORLD_SIZE"]),
    int(os.environ["LOCAL_RANK"]),
)


def main():
    device = torch.device("cuda", LOCAL_RANK) if torch.cuda.is_available() else torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 20, generator=g)
    y = (x[:, :5].sum(1) > 0).float()
    mine = torch.arange(RANK, len(x), WORLD)  # this rank's rows
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(3):
        order = mine[torch.randperm(len(mine), generator=torch.Generator().manual_seed(epoch))]
        for batch in order.split(64):
            xb, yb = x[batch].to(device), y[batch].to(device)
            loss = nn.functional.binary_cross_entropy_with_logits(model(xb).squeeze(1), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if RANK == 0:
            print(f"epoch {epoch}: loss {loss.item():.4f}")
    if RANK == 0:
        torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    main()
