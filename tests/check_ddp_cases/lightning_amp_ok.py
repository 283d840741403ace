# check_ddp: exit 0
"""A LightningModule-like class driven by a small hand-written loop, as people write it when they take
Lightning's structure without Lightning: training_step, validation_step, configure_optimizers. Mixed
precision with torch.autocast and a GradScaler, gradients unscaled and clipped before the step. GPU only.

    torchrun --standalone --nproc_per_node=2 lightning_amp_ok.py --max_epochs 3
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class LitClassifier(nn.Module):
    def __init__(self, hidden=64, lr=3e-3):
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(32, hidden), nn.GELU(), nn.Linear(hidden, 4))

    def forward(self, x):
        return self.net(x)

    def training_step(self, model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)

    def validation_step(self, batch):
        x, y = batch
        logits = self(x)
        return F.cross_entropy(logits, y, reduction="sum"), (logits.argmax(1) == y).sum()

    def configure_optimizers(self, parameters):
        return torch.optim.AdamW(parameters, lr=self.lr, weight_decay=0.01)


def datasets(seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1536, 32, generator=g)
    y = (x[:, :4].argmax(1)).long()
    return TensorDataset(x[:1024], y[:1024]), TensorDataset(x[1024:], y[1024:])


def fit(args):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    device = torch.device("cuda", local_rank)
    train_set, val_set = datasets()
    train_sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    val_sampler = DistributedSampler(val_set, shuffle=False, drop_last=False)
    train_loader = DataLoader(train_set, batch_size=32, sampler=train_sampler, pin_memory=True)
    val_loader = DataLoader(val_set, batch_size=64, sampler=val_sampler, pin_memory=True)

    torch.manual_seed(0)
    module = LitClassifier().to(device)
    model = DistributedDataParallel(module, device_ids=[local_rank])
    optimizer = module.configure_optimizers(model.parameters())
    scaler = torch.amp.GradScaler("cuda")

    for epoch in range(args.max_epochs):
        train_sampler.set_epoch(epoch)
        model.train()
        for batch in train_loader:
            batch = [t.to(device, non_blocking=True) for t in batch]
            with torch.autocast("cuda", dtype=torch.float16):
                loss = module.training_step(model, batch)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            scaler.step(optimizer)
            scaler.update()

        model.eval()
        sums = torch.zeros(3, device=device)
        with torch.no_grad():
            for batch in val_loader:
                x, y = (t.to(device, non_blocking=True) for t in batch)
                loss_sum, correct = module.validation_step((x, y))
                sums += torch.stack(
                    [
                        loss_sum,
                        correct.float(),
                        torch.tensor(float(len(y)), device=device),
                    ]
                )
        dist.all_reduce(sums)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: val_loss {sums[0] / sums[2]:.4f} val_acc {sums[1] / sums[2]:.3f}")

    if dist.get_rank() == 0:
        torch.save(
            {
                "state_dict": module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "scaler": scaler.state_dict(),
            },
            "last.ckpt",
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--max_epochs", type=int, default=3)
    fit(parser.parse_args())
