"""A pitfall of DDP step 5: a loss averaged as per-batch means over num_batches * world_size.

    python pitfalls/step5_metric_averaging.py

The guide sums each batch's mean loss, all-reduces the sum and divides it by
num_batches * world_size. That weighs a short last batch as much as a full one. Here:
17 samples on 2 ranks, batches of 4: each rank gets 9 (DistributedSampler draws one sample
on both, to even them), in batches 4, 4, 1. The exact mean all-reduces (sum of loss x
samples, samples), as the README's DDP step 5 and train_ddp.py do: the mean over every
sample the ranks trained on, the repeat counted, as it was trained on. (To score a set with
each sample once, evaluate as DDP step 10 does: no sampler's repeats.)
"""

import sys

import torch
import torch.distributed as dist
from _launch import report, results, tell, torchrun
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

N, BATCH = 17, 4


def setup():  # the same seeded data and model in every process
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, 3, generator=gen, dtype=torch.float64)
    dataset = TensorDataset(x, x.sum(1, keepdim=True) ** 2)
    torch.manual_seed(0)
    return dataset, torch.nn.Linear(3, 1).double()


def worker():  # each process of the job, started by torchrun
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    dataset, model = setup()
    loader = DataLoader(dataset, sampler=DistributedSampler(dataset, shuffle=False), batch_size=BATCH)

    # the mistake: per-batch means, summed, over num_batches * world_size
    running = 0.0
    for x, y in loader:
        running += torch.nn.functional.mse_loss(model(x), y).item()
    total = torch.tensor(running, dtype=torch.float64)
    dist.all_reduce(total)
    guide = total.item() / (len(loader) * world_size)

    # the fix: (sum of loss x samples, samples), all-reduced once
    totals = torch.zeros(2, dtype=torch.float64)
    for x, y in loader:
        totals += torch.stack(
            [torch.nn.functional.mse_loss(model(x), y, reduction="sum"), x.new_tensor(len(x))]
        )
    dist.all_reduce(totals)
    exact = (totals[0] / totals[1]).item()

    if rank == 0:
        # the truth: one process, every sample each rank drew, once per draw
        shards = [
            DistributedSampler(dataset, num_replicas=world_size, rank=r, shuffle=False)
            for r in range(world_size)
        ]
        drawn = [i for shard in shards for i in shard]
        x, y = dataset[drawn]
        truth = torch.nn.functional.mse_loss(model(x), y).item()
        batches = [len(x) for x, _ in loader]
        tell(guide=guide, exact=exact, truth=truth, batches=batches, drawn=len(drawn))
    dist.destroy_process_group()


def main():
    said = results(torchrun(__file__, "worker"))[0]
    guide, exact, truth = said["guide"], said["exact"], said["truth"]
    report(
        mistake="running += loss.item() per batch; all_reduce(running); running / (num_batches * world_size)",
        symptom=f"{N} samples on 2 ranks, {sum(said['batches'])} each (one a repeat), in batches of"
        f" {said['batches']}: mean loss {guide:.4f},\n"
        f"{100 * (guide / truth - 1):+.1f}% off the true {truth:.4f}",
        fix="all_reduce((sum of loss * len(batch), sum of len(batch))), once, over every sample trained on",
        result=f"mean loss {exact:.4f}, the true mean over the {said['drawn']} samples the ranks trained on"
        f" ({N} and the repeat): {truth:.4f}",
        checks={
            "a short last batch": said["batches"][-1] < BATCH,
            "the guide's mean is off by over 1%": abs(guide / truth - 1) > 0.01,
            "the exact mean is exact": abs(exact - truth) < 1e-9 * truth,
        },
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker()
    else:
        main()
