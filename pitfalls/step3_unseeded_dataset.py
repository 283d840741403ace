"""A pitfall of DDP step 3: a dataset drawn with unseeded torch.randn, in every rank.

    python pitfalls/step3_unseeded_dataset.py

The guide builds TensorDataset(torch.randn(N, 10), torch.randn(N, 1)) in each process.
Unseeded, each process draws its own: the sampler shards indices of a dataset that is
not the same on any two ranks. And with random labels there is nothing to learn: the
loss stays at the labels' variance, about 1.
"""

import gc
import math
import sys

import torch
import torch.distributed as dist
from _launch import report, results, tell, torchrun
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

N = 1024


def guide_dataset():  # the mistake: a fresh random draw in each process, random labels
    return TensorDataset(torch.randn(N, 10), torch.randn(N, 1))


def seeded_dataset():  # the fix: one seeded draw, the same in every process, of a task that can be learned
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(N, 10, generator=gen), torch.randn(10, 1, generator=gen) / math.sqrt(10)
    return TensorDataset(x, torch.sin(x @ w) + 0.1 * torch.randn(N, 1, generator=gen))


def train(dataset, epochs=10):
    """Train with DDP; return the last epoch's mean loss over every sample of every rank."""
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler = DistributedSampler(dataset, seed=0)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        totals = torch.zeros(2, dtype=torch.float64)  # (loss x samples, samples) on this rank
        for x, y in DataLoader(dataset, sampler=sampler, batch_size=32):
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            totals += torch.tensor([loss.item() * len(x), len(x)], dtype=torch.float64)
        dist.all_reduce(totals)
    return (totals[0] / totals[1]).item()


def worker():  # each process of the job, started by torchrun
    dist.init_process_group("gloo")
    said = {}
    for way, dataset in (("mistake", guide_dataset()), ("fix", seeded_dataset())):
        first = [None] * dist.get_world_size()  # each rank's first sample, x[0][0]
        dist.all_gather_object(first, round(dataset[0][0][0].item(), 4))
        said[way] = {"first": first, "loss": train(dataset), "label_var": dataset.tensors[1].var().item()}
    if dist.get_rank() == 0:
        tell(**said)
    gc.collect()  # torch 2.13, gloo: a DDP model alive at exit can abort the process (DDP step 7)
    dist.destroy_process_group()


def main():
    said = results(torchrun(__file__, "worker"))[0]
    mistake, fix = said["mistake"], said["fix"]
    report(
        mistake="dataset = TensorDataset(torch.randn(1024, 10), torch.randn(1024, 1))  # in every process",
        symptom=f"sample 0 is x[0][0] = {mistake['first'][0]} on rank 0, {mistake['first'][1]} on rank 1:"
        " a different dataset on each rank;\n"
        f"after 10 epochs the loss is {mistake['loss']:.3f}, rank 0's labels' variance"
        f" {mistake['label_var']:.3f}: nothing learned",
        fix="draw it from a seeded generator (torch.Generator().manual_seed(0)), as a task y = f(x) + noise",
        result=f"x[0][0] = {fix['first'][0]} on both ranks; loss {fix['loss']:.3f}"
        f" against the labels' variance {fix['label_var']:.3f}",
        checks={
            "the ranks' data differ": mistake["first"][0] != mistake["first"][1],
            "random labels are not learned": mistake["loss"] > 0.7 * mistake["label_var"],
            "the fix's data agree": fix["first"][0] == fix["first"][1],
            "the fix learns": fix["loss"] < 0.2 * fix["label_var"],
        },
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker()
    else:
        main()
