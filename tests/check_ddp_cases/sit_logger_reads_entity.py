# check_ddp: exit 1, FAIL script DDP000
"""A transformer for images trained as a research repository's train.py reads: create_logger() on rank 0,
an experiment folder, a run named after the user's tracking entity, a DistributedSampler, the loss
all-reduced.

    torchrun --standalone --nproc_per_node=2 sit_logger_reads_entity.py

Mistake, of the script's own and no DDP step's: rank 0 reads os.environ["ENTITY"] (the experiment
tracker's account) to name the run, with or without tracking asked for; where ENTITY is not set, it stops
with KeyError before training, whatever the DDP code does. The report files it under the script itself,
not under the DDP step the job was in.
"""

import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def create_logger(folder):
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s] %(message)s")
    logger = logging.getLogger(__name__)
    logger.info(f"experiment folder: {folder}")
    return logger


def main(args):
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    device = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(device)
    if rank == 0:
        run_name = f"{os.environ['ENTITY']}-{args.model}"  # check_ddp: here
        os.makedirs(os.path.join("results", run_name), exist_ok=True)
        logger = create_logger(os.path.join("results", run_name))
    torch.manual_seed(0)
    model = DDP(
        nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 16)).to(device), device_ids=[device]
    )
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(512, 16, generator=g))
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        totals = torch.zeros(2, device=device)
        for (x,) in loader:
            x = x.to(device)
            loss = (model(x) - x).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(x), torch.tensor(float(len(x)), device=device)])
        dist.all_reduce(totals)
        if rank == 0:
            logger.info(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="SiT-XS")
    parser.add_argument("--wandb", action="store_true")
    main(parser.parse_args())
