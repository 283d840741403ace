# check_ddp: exit 0, warn step 5 DDP506
"""A Trainer-class classifier on synthetic 2-D blobs, the shape of many tutorial-derived DDP
scripts: a Trainer with _run_epoch / _evaluate / _save, a per-epoch summary line on rank 0.

    torchrun --standalone --nproc_per_node=2 a1_loss_stacked_item.py

Mistake: _run_epoch stacks the epoch's training totals (loss x samples, correct, samples) into
one tensor and rank 0 reads them with .item() as "the" train loss and accuracy, but that tensor
is never all-reduced: it holds rank 0's half of the data only. The held-out evaluation right
after it is all-reduced properly, so the script looks converted; the train numbers are one
shard's estimate shown as the job's value (a warn of step 5, not a wrong result of training).
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_blobs(n, seed):
    g = torch.Generator().manual_seed(seed)
    centers = torch.tensor([[2.0, 0.0], [-1.0, 1.7], [-1.0, -1.7]])
    labels = torch.randint(0, 3, (n,), generator=g)
    points = centers[labels] + 0.9 * torch.randn(n, 2, generator=g)
    return TensorDataset(points, labels)


class Trainer:
    def __init__(self, model, train_set, val_set, batch_size, lr, ckpt_path="a1_checkpoint.pt"):
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.local_rank = int(os.environ["LOCAL_RANK"])
        if torch.cuda.is_available():
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")
        self.model = DDP(
            model.to(self.device),
            device_ids=[self.device.index] if self.device.type == "cuda" else None,
        )
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=lr, momentum=0.9)
        self.sampler = DistributedSampler(train_set, shuffle=True, seed=0)
        self.train_loader = DataLoader(train_set, batch_size=batch_size, sampler=self.sampler)
        val_part = Subset(val_set, range(self.rank, len(val_set), self.world_size))
        self.val_loader = DataLoader(val_part, batch_size=256)
        self.ckpt_path = ckpt_path

    def _run_epoch(self, epoch):
        self.model.train()
        self.sampler.set_epoch(epoch)
        totals = torch.zeros(3, device=self.device)  # loss x n, correct, n
        for x, y in self.train_loader:
            x, y = x.to(self.device), y.to(self.device)
            self.optimizer.zero_grad()
            logits = self.model(x)
            loss = F.cross_entropy(logits, y)
            loss.backward()
            self.optimizer.step()
            totals += torch.stack(
                [loss.detach() * len(x), (logits.argmax(1) == y).sum().float(), totals.new_tensor(len(x))]
            )
        return totals

    @torch.no_grad()
    def _evaluate(self):
        self.model.eval()
        stats = torch.zeros(3, device=self.device)
        for x, y in self.val_loader:
            x, y = x.to(self.device), y.to(self.device)
            logits = self.model.module(x)
            stats[0] += F.cross_entropy(logits, y, reduction="sum")
            stats[1] += (logits.argmax(1) == y).sum()
            stats[2] += len(x)
        dist.all_reduce(stats)
        return stats

    def _save(self, epoch):
        torch.save(
            {
                "model": self.model.module.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "epoch": epoch,
            },
            self.ckpt_path,
        )

    def fit(self, epochs):
        for epoch in range(epochs):
            totals = self._run_epoch(epoch)
            val = self._evaluate()
            if self.rank == 0:
                train_loss = totals[0].item() / totals[2].item()
                train_acc = totals[1].item() / totals[2].item()
                val_loss, val_acc = (val[0] / val[2]).item(), (val[1] / val[2]).item()
                print(
                    f"epoch {epoch} | train loss {train_loss:.4f} acc {train_acc:.3f}"
                    f" | val loss {val_loss:.4f} acc {val_acc:.3f}"
                )
                self._save(epoch)


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(2, 32), nn.ReLU(), nn.Linear(32, 3))
    trainer = Trainer(model, make_blobs(1200, seed=0), make_blobs(301, seed=1), batch_size=50, lr=0.05)
    trainer.fit(epochs=3)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
