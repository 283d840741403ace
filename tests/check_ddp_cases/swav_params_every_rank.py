# check_ddp: exit 1, FAIL step 6 DDP610
"""A self-supervised trainer in the style of FAIR's SwAV and VICReg: initialize_exp() dumps the run's
settings to params.pkl and opens a stats file, on every rank, before training; rank 0 then saves the
checkpoints. GPU only.

    torchrun --standalone --nproc_per_node=2 swav_params_every_rank.py --dump_path exp

Mistake: every rank writes params.pkl over at once (pickle.dump into open(..., "wb")): N processes
truncate and write one file at the same moment, and on a shared folder what is left may be torn. Dump
it from rank 0 alone.
"""

import argparse
import os
import pickle

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser(description="Implementation of SwAV")
parser.add_argument("--dump_path", type=str, default=".", help="experiment dump path for checkpoints and log")
parser.add_argument("--epochs", default=2, type=int)
parser.add_argument("--batch_size", default=32, type=int)


def initialize_exp(params):
    """Dump the settings, and the folder for the checkpoints (on every rank, as the original does)."""
    os.makedirs(params.dump_path, exist_ok=True)
    pickle.dump(params, open(os.path.join(params.dump_path, "params.pkl"), "wb"))  # check_ddp: here
    return os.path.join(params.dump_path, "checkpoint.pth.tar")


def main():
    args = parser.parse_args()
    dist.init_process_group(backend="nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    checkpoint = initialize_exp(args)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 16, generator=g))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 8)).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        meter = torch.zeros(2).cuda()
        for (x,) in loader:
            z = nn.functional.normalize(model(x.cuda(non_blocking=True)), dim=1)
            loss = -(z @ z.t()).logsumexp(dim=1).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            meter += torch.stack([loss.detach() * len(x), loss.new_tensor(len(x))])
        dist.all_reduce(meter)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {(meter[0] / meter[1]).item():.4f}")
            torch.save(
                {
                    "epoch": epoch + 1,
                    "state_dict": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                },
                checkpoint,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
