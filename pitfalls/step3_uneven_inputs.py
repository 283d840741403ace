"""A pitfall of DDP step 3: uneven inputs: ranks with different batch counts hang in the next collective.

    python pitfalls/step3_uneven_inputs.py

Each rank takes its own slice of the dataset, here Subset(dataset, range(rank, N, world_size)):
with 9 samples, rank 0 gets 5 and rank 1 gets 4, so 3 batches of 2 against 2 (a sampler
that does not pad does the same, and so does a dataset split into unequal files). Each
backward() all-reduces the gradients with every rank: rank 0's third has no partner.
Rank 1 leaves the loop and waits in the next collective (here a barrier); rank 0 waits
in its third backward(). The job hangs until the process group's timeout (30 minutes by
default, 10 with nccl; 3 s here).
Two fixes: DistributedSampler pads every rank's share to the same length by repeating
samples from the start (or, with drop_last=True, drops the tail), so that every rank runs
as many batches; or the loop runs inside `with Join([model]):` (torch.distributed.algorithms.join),
which lets ranks finish unevenly: a rank that has run out shadows the others' all-reduces
with zeros until all are done (the gradients of those last batches are then divided by
the whole world size), and the model ends the same on every rank. Join costs two
one-number all-reduces in every forward(), to count the ranks still running.
"""

import gc
import re
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from _launch import GAVE_UP, TIMEOUT_S, error_line, report, tell, told, torchrun
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset
from torch.utils.data.distributed import DistributedSampler

N, BATCH = 9, 2


def dataset():
    gen = torch.Generator().manual_seed(0)  # the same data in every process
    return TensorDataset(torch.randn(N, 4, generator=gen), torch.randn(N, 1, generator=gen))


def train(loader, join=False):
    """One epoch of DDP training; return how many batches this rank ran, and the final weights."""
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = 0
    with Join([model], enable=join):
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()  # DDP all-reduces the gradients here, with every rank
            optimizer.step()
            optimizer.zero_grad()
            batches += 1
    dist.barrier()  # every rank is done; then rank 0 would save the model
    weights = torch.cat([p.detach().flatten() for p in model.parameters()])
    del model
    gc.collect()  # torch 2.13, gloo: a DDP model alive at exit can abort the process (DDP step 7)
    return batches, weights


def worker():  # each process of the job, started by torchrun
    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    data = dataset()
    own_slice = DataLoader(Subset(data, range(rank, N, world_size)), batch_size=BATCH)  # the mistake's
    padded = DataLoader(data, sampler=DistributedSampler(data, shuffle=False), batch_size=BATCH)
    dropped = DataLoader(
        data, sampler=DistributedSampler(data, shuffle=False, drop_last=True), batch_size=BATCH
    )
    said = {}  # the fixes first, as the mistake ends the job
    for way, loader, join in (
        ("padded", padded, False),
        ("drop_last", dropped, False),
        ("Join", own_slice, True),
    ):
        batches, weights = train(loader, join=join)
        every_rank = [torch.zeros_like(weights) for _ in range(world_size)]
        dist.all_gather(every_rank, weights)
        said[way] = {"batches": batches, "same_weights": all(torch.equal(w, weights) for w in every_rank)}
    tell(rank=rank, fixes=said, padded_samples=len(padded.sampler) * world_size, batches=len(own_slice))
    train(own_slice)  # the mistake: each rank its own slice, and no Join
    dist.destroy_process_group()


def waited_in(stderr, rank):
    """The line of this file where a rank of the mistake waited when it gave up: its traceback's last."""
    lines = stderr.splitlines()
    here = [
        i
        for i, line in enumerate(lines)
        if re.match(rf"^\[rank{rank}\]:\s+File \"{re.escape(__file__)}\"", line)
    ]
    return re.sub(rf"^\[rank{rank}\]:\s+", "", lines[here[-1] + 1]).split("  #")[0] if here else ""


def main():
    job = torchrun(__file__, "worker")
    said = sorted(told(job), key=lambda p: p["rank"])
    has = {p["rank"]: p["batches"] for p in said}  # batches of the mistake, rank by rank
    where = [waited_in(job.stderr, r) for r in (0, 1)]
    # the first rank to give up times out; the other then times out too, or sees it leave
    timed_out = [error_line(job.stderr, rf"^\[rank{r}\]: {GAVE_UP}") for r in (0, 1)]
    fixes = {way: [p["fixes"][way] for p in said] for way in ("padded", "drop_last", "Join")}
    batches = {way: [rank["batches"] for rank in ranks] for way, ranks in fixes.items()}
    padded_samples = said[0]["padded_samples"] if said else 0
    report(
        mistake=f"Subset(dataset, range(rank, {N}, world_size))  # {N} samples:"
        f" {len(range(0, N, 2))} on rank 0, {len(range(1, N, 2))} on rank 1",
        symptom=f"rank 0 has {has.get(0)} batches, rank 1 has {has.get(1)}; rank 1 leaves the loop and"
        f" waits in `{where[1]}`,\nrank 0 in its last batch's `{where[0]}`; after {TIMEOUT_S} s, both:\n"
        + "\n".join(timed_out),
        fix="DistributedSampler(dataset), which pads every rank's share to as many batches (drop_last=True:"
        " drops);\nor `with Join([model]):` around the loop, which lets ranks finish unevenly",
        result=f"batches on ranks 0 and 1: padded {batches['padded']} ({padded_samples} samples"
        f" for {N}: {padded_samples - N} repeated), drop_last {batches['drop_last']},\n"
        f"Join {batches['Join']}; every way finishes, with the same weights on both ranks",
        checks={
            "the ranks of the mistake had uneven batches": has == {0: 3, 1: 2},
            "rank 0 waited in its backward(), rank 1 in the barrier": "backward()" in where[0]
            and "dist.barrier()" in where[1],
            "both ranks of the mistake failed, one by the timeout": job.returncode == 1
            and all(timed_out)
            and any("Timed out" in line for line in timed_out),
            "the sampler evened the batches": batches["padded"] == [3, 3] and batches["drop_last"] == [2, 2],
            "Join let the ranks finish unevenly": batches["Join"] == [3, 2],
            "every way ended with the same weights on every rank": all(
                rank["same_weights"] for ranks in fixes.values() for rank in ranks
            ),
        },
        runs=(job,),
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker()
    else:
        main()
