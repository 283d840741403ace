# check_ddp: exit 1, FAIL script DDP000
"""Train a small classifier the way torchtitan's train.py reads: main() as a list of numbered steps,
one config dataclass, gradient accumulation with no_sync(), an exact evaluation, ckpt.pt at the end,
reloaded by every rank.

    torchrun --standalone --nproc_per_node=2 titan_crash_in_eval.py
    torchrun --standalone --nproc_per_node=2 titan_crash_in_eval.py --training.epochs 2

Mistake: an ordinary bug: evaluate() logs one random example of its last batch with
random.randint(0, len(y)), whose upper end is inclusive; on rank 1, in epoch 2, it draws len(y) and
raises IndexError. The script's own error, raised by its own code while it evaluated: no DDP step's.
"""

import argparse
import contextlib
import logging
import os
import random
import time
from dataclasses import dataclass, field, fields

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

logger = logging.getLogger("titan_ok")


@dataclass
class Job:
    dump_folder: str = "./outputs"
    seed: int = 42


@dataclass
class Training:
    epochs: int = 3
    local_batch_size: int = 16
    gradient_accumulation_steps: int = 2
    lr: float = 3e-3
    dataset_size: int = 2048
    eval_size: int = 400


@dataclass
class JobConfig:
    job: Job = field(default_factory=Job)
    training: Training = field(default_factory=Training)

    @classmethod
    def from_args(cls):
        """Every field as a --section.name flag, with its default."""
        config = cls()
        parser = argparse.ArgumentParser(formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        for section in fields(config):
            for f in fields(getattr(config, section.name)):
                default = getattr(getattr(config, section.name), f.name)
                parser.add_argument(f"--{section.name}.{f.name}", type=type(default), default=default)
        for key, value in vars(parser.parse_args()).items():
            section, name = key.split(".")
            setattr(getattr(config, section), name, value)
        return config


def init_logger():
    logging.basicConfig(format="[titan] %(asctime)s - %(levelname)s - %(message)s", level=logging.INFO)


def build_dataset(size, seed):
    """Points in 8 dimensions, labelled by which of 4 fixed centres is nearest."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)) * 2
    x = torch.randn(size, 8, generator=g) * 2
    y = torch.cdist(x, centres).argmin(dim=1)
    return TensorDataset(x, y)


def build_model():
    return nn.Sequential(nn.Linear(8, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 4))


@torch.no_grad()
def evaluate(model, loader, device):
    model.eval()
    totals = torch.zeros(3, dtype=torch.float64, device=device)  # loss sum, correct, samples
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        logits = model(x)
        totals[0] += nn.functional.cross_entropy(logits, y, reduction="sum")
        totals[1] += (logits.argmax(dim=1) == y).sum()
        totals[2] += len(y)
    # log one example of the last batch
    i = random.randint(0, len(y))
    logger.info(f"example: label {y[i].item()}, predicted {logits[i].argmax().item()}")  # check_ddp: here
    dist.all_reduce(totals, op=dist.ReduceOp.SUM)
    model.train()
    return totals[0].item() / totals[2].item(), totals[1].item() / totals[2].item()


def main(config: JobConfig):
    init_logger()

    # 1. init distributed
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group(backend="nccl", device_id=device)
    rank, world_size = dist.get_rank(), dist.get_world_size()
    random.seed(rank)  # each rank logs different examples
    logger.info(f"rank {rank}/{world_size} on {device}")

    # 2. build dataloaders
    train_set = build_dataset(config.training.dataset_size, config.job.seed)
    eval_set = build_dataset(config.training.eval_size, config.job.seed + 1)
    train_sampler = DistributedSampler(train_set, shuffle=True, seed=config.job.seed)
    eval_sampler = DistributedSampler(eval_set, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=config.training.local_batch_size, sampler=train_sampler)
    eval_loader = DataLoader(eval_set, batch_size=128, sampler=eval_sampler)

    # 3. build model, on its device, wrapped for data parallel
    torch.manual_seed(config.job.seed)
    model = build_model().to(device)
    model = DDP(model, device_ids=[local_rank])

    # 4. build optimizer and loss
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.training.lr)
    loss_fn = nn.CrossEntropyLoss()

    # 5. train
    accum = config.training.gradient_accumulation_steps
    for epoch in range(config.training.epochs):
        train_sampler.set_epoch(epoch)
        start = time.perf_counter()
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        seen = 0
        for step, (x, y) in enumerate(train_loader):
            x, y = x.to(device), y.to(device)
            sync = (step + 1) % accum == 0 or step + 1 == len(train_loader)
            with contextlib.nullcontext() if sync else model.no_sync():
                loss = loss_fn(model(x), y)
                (loss / accum).backward()
            if sync:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.detach() * len(y)
            seen += len(y)

        # 6. metrics: exact means over all ranks, the same on every rank
        totals = torch.stack([loss_sum, torch.tensor(seen, dtype=torch.float64, device=device)])
        dist.all_reduce(totals, op=dist.ReduceOp.SUM)
        eval_loss, eval_acc = evaluate(model, eval_loader, device)
        if rank == 0:
            logger.info(
                f"epoch {epoch + 1}: loss {totals[0].item() / totals[1].item():.4f}  "
                f"eval loss {eval_loss:.4f}  eval acc {eval_acc:.3f}  ({time.perf_counter() - start:.2f}s)"
            )

    # 7. checkpoint, from rank 0
    path = os.path.join(config.job.dump_folder, "ckpt.pt")
    if rank == 0:
        os.makedirs(config.job.dump_folder, exist_ok=True)
        checkpoint = {
            "model": model.module.state_dict(),
            "optimizer": optimizer.state_dict(),
            "epoch": epoch + 1,
        }
        torch.save(checkpoint, path)
        logger.info(f"saved {path}")

    # 8. reload it on every rank, and check that it evaluates the same
    dist.barrier()  # the file is whole before any rank reads it
    state = torch.load(path, map_location=device, weights_only=True)
    model.module.load_state_dict(state["model"])
    eval_loss, eval_acc = evaluate(model, eval_loader, device)
    if rank == 0:
        logger.info(f"reloaded {path}: eval loss {eval_loss:.4f}  eval acc {eval_acc:.3f}")

    # 9. shut down
    dist.destroy_process_group()


if __name__ == "__main__":
    main(JobConfig.from_args())
