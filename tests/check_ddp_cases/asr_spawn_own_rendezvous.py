# check_ddp: exit 1, FAIL step 8 DDP801
"""A speech model's training script, in the style of many research repositories: the script starts
its own processes with mp.spawn, one per GPU it counts (on a machine of one GPU it trains alone, in
the same process, with no process group), each setting the rendezvous address for the job before it
joins it.

    python asr_spawn_own_rendezvous.py

Mistake: launched with torchrun (its processes are the job's already), each of torchrun's workers
spawns a job of its own: FAIL step 8. The MASTER_ADDR/MASTER_PORT each process sets are that own
launch's, not a mistake of step 1 of their own: they follow from step 8 (run as the script launches
itself, they are what mp.spawn needs), also where a first run, on nodes of one GPU each, saw only the
script training alone (a warning at step 1) and the check ran it again as one node. The rest is
right: set_epoch, the loss all-reduced, rank 0 saving the bare model and the optimizer.
"""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def frames(n, seed):
    """n utterances of 40 frames of 16 features, and a class each (the acoustic model's stand-in)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 40, 16, generator=g)
    return TensorDataset(x, (x.mean((1, 2)) > 0).long())


def init_process(rank, world_size):
    """Join the job this script started."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29500"
    dist.init_process_group("nccl", rank=rank, world_size=world_size)


def train(rank, world_size, epochs):
    """Train on GPU `rank` of a job of world_size processes; world_size None: alone, no group."""
    alone = world_size is None
    if not alone:
        init_process(rank, world_size)
    torch.cuda.set_device(rank)
    data = frames(256, seed=3)
    sampler = None if alone else DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True)
    loader = DataLoader(data, batch_size=16, sampler=sampler, shuffle=alone)
    torch.manual_seed(3)
    model, head = nn.GRU(16, 32, batch_first=True).cuda(rank), nn.Linear(32, 2).cuda(rank)
    if not alone:
        model, head = DDP(model, device_ids=[rank]), DDP(head, device_ids=[rank])
    optimizer = torch.optim.Adam([*model.parameters(), *head.parameters()], lr=1e-3)
    for epoch in range(epochs):
        if not alone:
            sampler.set_epoch(epoch)
        total = torch.zeros(2, device=f"cuda:{rank}")
        for x, y in loader:
            x, y = x.cuda(rank), y.cuda(rank)
            out, _ = model(x)
            loss = nn.functional.cross_entropy(head(out[:, -1]), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += torch.stack([loss.detach() * len(y), torch.tensor(float(len(y)), device=total.device)])
        if not alone:
            dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch}: loss {(total[0] / total[1]).item():.4f}", flush=True)
            bare = (model, head) if alone else (model.module, head.module)
            state = {"gru": bare[0].state_dict(), "head": bare[1].state_dict()}
            torch.save({**state, "optimizer": optimizer.state_dict(), "epoch": epoch}, "asr.pt")
    if not alone:
        dist.destroy_process_group()


if __name__ == "__main__":
    world_size = torch.cuda.device_count()
    if world_size > 1:
        mp.spawn(train, args=(world_size, 2), nprocs=world_size)  # check_ddp: here
    else:
        train(0, None, 2)  # one GPU: alone
