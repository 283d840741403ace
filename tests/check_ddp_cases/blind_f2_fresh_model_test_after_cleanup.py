# check_ddp: exit 0
"""A main()/argparse script with a separate final-test function, in the style of a course
project: train with DDP, save `checkpoints/best_model.pth` whenever validation accuracy
improves, tear the process group down, and then rank 0 builds a brand-new, unwrapped network,
loads the best weights and writes the test metrics to test_results.json.

    torchrun --standalone --nproc_per_node=2 f2_fresh_model_test_after_cleanup.py --epochs 3

Correct: the final test runs after destroy_process_group() on every rank, inside `if rank ==
0:`, on a fresh SmallCNN() that was never wrapped: no collective can be involved, the other
rank simply exits. The best-epoch choice comes from all-reduced validation counts, so every
rank agrees on it, and only rank 0 writes the checkpoint and the JSON: exit 0.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class SmallCNN(nn.Module):
    def __init__(self, classes=3):
        super().__init__()
        self.c1 = nn.Conv2d(1, 4, 3)
        self.c2 = nn.Conv2d(4, 8, 3)
        self.fc = nn.Linear(8 * 6 * 6, classes)

    def forward(self, x):
        x = F.relu(self.c1(x))
        x = F.relu(self.c2(x))
        return self.fc(x.flatten(1))


def stripes(n, seed):
    """10x10 images with horizontal, vertical or diagonal stripes, plus noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    i, j = torch.meshgrid(torch.arange(10), torch.arange(10), indexing="ij")
    kinds = torch.stack([(i % 2), (j % 2), ((i + j) % 2)]).float()
    x = kinds[y].unsqueeze(1) + 0.7 * torch.randn(n, 1, 10, 10, generator=g)
    return TensorDataset(x, y)


def final_test(args, device):
    net = SmallCNN().to(device)
    net.load_state_dict(torch.load(os.path.join(args.ckpt_dir, "best_model.pth"), map_location=device))
    net.eval()
    correct = total = 0
    with torch.no_grad():
        for x, y in DataLoader(stripes(240, seed=args.seed + 2), batch_size=80):
            correct += (net(x.to(device)).argmax(1) == y.to(device)).sum().item()
            total += len(y)
    result = {"test_accuracy": correct / total, "n_test": total}
    with open("test_results.json", "w") as f:
        json.dump(result, f)
    print("final test:", result)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.02)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--ckpt-dir", default="checkpoints")
    args = ap.parse_args()

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        os.makedirs(args.ckpt_dir, exist_ok=True)

    train_ds, val_ds = stripes(512, seed=args.seed), stripes(160, seed=args.seed + 1)
    sampler = DistributedSampler(train_ds, seed=args.seed)
    train_dl = DataLoader(train_ds, batch_size=args.batch_size, sampler=sampler)
    val_dl = DataLoader(Subset(val_ds, list(range(rank, len(val_ds), world))), batch_size=80)

    torch.manual_seed(args.seed)
    model = DDP(SmallCNN().to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    best_acc = -1.0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        loss_n = torch.zeros(2, device=device)
        for x, y in train_dl:
            x, y = x.to(device), y.to(device)
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            loss_n += torch.stack([loss.detach() * len(y), loss_n.new_tensor(len(y))])
        model.eval()
        hits = torch.zeros(2, device=device)
        with torch.no_grad():
            for x, y in val_dl:
                x, y = x.to(device), y.to(device)
                hits += torch.stack([(model.module(x).argmax(1) == y).sum().float(), hits.new_tensor(len(y))])
        stats = torch.cat([loss_n, hits])
        dist.all_reduce(stats)
        val_acc = (stats[2] / stats[3]).item()
        if rank == 0:
            print(f"epoch {epoch} loss {(stats[0] / stats[1]).item():.4f} val_acc {val_acc:.3f}")
            if val_acc > best_acc:
                torch.save(model.module.state_dict(), os.path.join(args.ckpt_dir, "best_model.pth"))
        best_acc = max(best_acc, val_acc)

    dist.destroy_process_group()

    if rank == 0:
        final_test(args, device)


if __name__ == "__main__":
    main()
