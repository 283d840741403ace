# check_ddp: exit 1, FAIL step 3 DDP302, see step3_unseeded_dataset
"""A learner's own conversion (a GRU classifier on synthetic token sequences, a scheduler, a resume)
whose data generator is seeded by the machine: each rank builds its own training AND held-out sets.
Step 3 FAILs (the ranks' datasets differ); step 10 must not claim that each held-out sample counted
once, since the ranks' held-out sets are not one set: it is not checked (--), and says why.

    torchrun --standalone --nproc_per_node=2 learner_unseeded_data.py
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

VOCAB, SEQ_LEN = 20, 24


def make_data(n, seed):
    g = torch.Generator()
    g.seed()  # the mistake: a seed of the machine's, its own on each rank (the argument is unused)
    x = torch.randint(0, VOCAB, (n, SEQ_LEN), generator=g)
    # label: does token 3 occur more often than token 7?
    y = ((x == 3).sum(1) > (x == 7).sum(1)).long()
    return TensorDataset(x, y)


class GRUClassifier(nn.Module):
    def __init__(self, emb=16, hidden=32):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, emb)
        self.gru = nn.GRU(emb, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 2)

    def forward(self, x):
        _, h = self.gru(self.emb(x))
        return self.head(h[-1])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--ckpt", default="ckpt/seq.pt")
    p.add_argument("--resume", action="store_true", help="continue from --ckpt")
    args = p.parse_args()

    torch.manual_seed(0)
    local_rank = int(os.environ["LOCAL_RANK"])  # DDP step 2
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", device_id=device.index)  # DDP step 1
    train_set, val_set = make_data(3000, seed=0), make_data(600, seed=1)
    sampler = DistributedSampler(train_set)  # DDP step 3
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    val_part = Subset(val_set, range(dist.get_rank(), len(val_set), dist.get_world_size()))  # DDP step 10
    val_loader = DataLoader(val_part, batch_size=256)

    model = GRUClassifier().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    loss_fn = nn.CrossEntropyLoss()

    start_epoch = 0
    if args.resume and os.path.exists(args.ckpt):
        ck = torch.load(args.ckpt, map_location=device)
        model.load_state_dict(ck["model"])
        optimizer.load_state_dict(ck["optimizer"])
        scheduler.load_state_dict(ck["scheduler"])
        start_epoch = ck["epoch"] + 1
        if dist.get_rank() == 0:
            print(f"resumed from {args.ckpt} at epoch {start_epoch}")
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)  # DDP step 4

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # DDP step 3
        model.train()
        loss_sum, count = torch.zeros((), device=device), 0
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            optimizer.step()
            loss_sum += loss.detach() * len(x)
            count += len(x)
        scheduler.step()
        totals = torch.stack([loss_sum, loss_sum.new_tensor(count)])
        dist.all_reduce(totals)  # DDP step 5

        model.eval()
        correct, val_n = torch.zeros((), device=device), 0
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.to(device), y.to(device)
                correct += (model.module(x).argmax(1) == y).sum()  # DDP step 10
                val_n += len(x)
        val_totals = torch.stack([correct.float(), correct.new_tensor(val_n).float()])
        dist.all_reduce(val_totals)  # DDP step 10
        if dist.get_rank() == 0:  # DDP step 6
            print(
                f"epoch {epoch}  loss {(totals[0] / totals[1]).item():.4f}  "
                f"val_acc {(val_totals[0] / val_totals[1]).item():.4f}  lr {scheduler.get_last_lr()[0]:.2e}"
            )
            os.makedirs(os.path.dirname(args.ckpt), exist_ok=True)
            torch.save(
                {
                    "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(),
                    "epoch": epoch,
                },
                args.ckpt,
            )
    dist.destroy_process_group()  # DDP step 7


if __name__ == "__main__":
    main()
