# check_ddp: exit 1, FAIL step 10 DDP1009
"""A Trainer class in the style of the ddp-tutorial-series, with a validation pass added by its user:
the validation set gets a DistributedSampler like the training set, and `evaluate()` divides the
correct count by `len(self.val_loader.dataset)`, as their single-GPU script did.

    torchrun --standalone --nproc_per_node=2 trainer_val_accuracy_whole_set.py

Mistake: each rank counts the correct answers of its shard only, never all-reduced, and divides by
the whole validation set's size: rank 0 prints about half the true accuracy on 2 processes.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_set(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 8, generator=g)
    return TensorDataset(x, (x.sum(1) > 0).long())


class Trainer:
    def __init__(self, local_rank):
        self.local_rank = local_rank
        self.device = torch.device("cuda", local_rank)
        train_set, val_set = make_set(256, 11), make_set(128, 12)
        self.sampler = DistributedSampler(train_set, shuffle=True, seed=11)
        self.train_loader = DataLoader(train_set, batch_size=32, sampler=self.sampler)
        self.val_loader = DataLoader(
            val_set, batch_size=64, sampler=DistributedSampler(val_set, shuffle=False)
        )
        torch.manual_seed(11)
        self.model = DDP(nn.Linear(8, 2).to(self.device), device_ids=[local_rank])
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.1)

    def train_epoch(self, epoch):
        self.sampler.set_epoch(epoch)
        total = torch.zeros(2, device=self.device)
        for x, y in self.train_loader:
            x, y = x.to(self.device), y.to(self.device)
            self.optimizer.zero_grad()
            loss = F.cross_entropy(self.model(x), y)
            loss.backward()
            self.optimizer.step()
            total += torch.stack([loss.detach() * len(y), torch.tensor(float(len(y)), device=self.device)])
        dist.all_reduce(total)
        return (total[0] / total[1]).item()

    def evaluate(self):
        self.model.eval()
        correct = 0
        with torch.no_grad():
            for x, y in self.val_loader:
                x, y = x.to(self.device), y.to(self.device)
                correct += (self.model(x).argmax(1) == y).sum().item()
        self.model.train()
        return correct / len(self.val_loader.dataset)  # check_ddp: here

    def run(self, epochs):
        for epoch in range(epochs):
            train_loss = self.train_epoch(epoch)
            accuracy = self.evaluate()
            if dist.get_rank() == 0:
                print(f"epoch {epoch} train_loss {train_loss:.4f} val_acc {accuracy:.3f}", flush=True)
                state = {"model": self.model.module.state_dict(), "optimizer": self.optimizer.state_dict()}
                torch.save({**state, "epoch": epoch}, "snapshot.pt")


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    Trainer(local_rank).run(epochs=2)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
