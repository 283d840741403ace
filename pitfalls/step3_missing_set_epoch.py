"""A pitfall of DDP step 3: a DistributedSampler without sampler.set_epoch(epoch).

    python pitfalls/step3_missing_set_epoch.py

DistributedSampler shuffles with a seed plus the epoch it was told. Never told, it stays
at epoch 0: every epoch visits the same order, the shuffle happens once per job.
"""

import sys

import torch.distributed as dist
from _launch import report, results, tell, torchrun
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

DATASET = range(8)  # 8 samples; each one is its own index, so a batch shows which samples it holds


def epoch_orders(set_epoch, epochs=3):
    """The samples this rank visits, in order, in each epoch."""
    sampler = DistributedSampler(DATASET, shuffle=True, seed=0)
    loader = DataLoader(DATASET, sampler=sampler, batch_size=2)
    orders = []
    for epoch in range(epochs):
        if set_epoch:
            sampler.set_epoch(epoch)  # the fix: a new shuffle each epoch, the same one on every rank
        orders.append([i for batch in loader for i in batch.tolist()])
    return orders


def worker():  # each process of the job, started by torchrun
    dist.init_process_group("gloo")
    mine = {"mistake": epoch_orders(set_epoch=False), "fix": epoch_orders(set_epoch=True)}
    every_rank = [None] * dist.get_world_size()
    dist.all_gather_object(every_rank, mine)
    if dist.get_rank() == 0:
        tell(ranks=every_rank)
    dist.destroy_process_group()


def main():
    job = torchrun(__file__, "worker")
    ranks = results(job)[0]["ranks"]
    mistake, fix = ranks[0]["mistake"], ranks[0]["fix"]  # rank 0's orders, epoch by epoch
    covered = all(
        sorted(ranks[0][way][e] + ranks[1][way][e]) == list(DATASET)
        for way in ("mistake", "fix")
        for e in range(3)
    )
    report(
        mistake="for epoch in range(3): for batch in loader: ...   # no sampler.set_epoch(epoch)",
        symptom=f"rank 0 visits the same order every epoch: {'  '.join(map(str, mistake))}",
        fix="sampler.set_epoch(epoch) at the start of each epoch, on every rank",
        result=f"rank 0, epoch by epoch: {'  '.join(map(str, fix))}"
        "  (the ranks' shards still cover the data)",
        checks={
            "the mistake repeats its order": all(order == mistake[0] for order in mistake),
            "the fix changes it": len({tuple(order) for order in fix}) == 3,
            "every epoch, the two ranks cover the data once": covered,
        },
        runs=(job,),
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker()
    else:
        main()
