"""A pitfall of DDP step 10: a last evaluation through the DDP model, on rank 0 alone.

    python pitfalls/step10_evaluate_through_ddp_on_rank_zero.py

After training, rank 0 alone evaluates the held-out set through the wrapper, model(x), as a
single-GPU script does, while every other rank goes on to the barrier that waits for rank 0's
checkpoint. DDP's forward broadcasts the model's buffers (here BatchNorm's running statistics)
from rank 0 to every rank, on every call: a collective, which the other ranks never join. Rank 0
waits in that broadcast, rank 1 in the barrier, until the process group's timeout (30 minutes by
default, 10 with nccl; 3 s here). A model without buffers broadcasts nothing there, in torch 2.13,
under torch.no_grad(): the same evaluation then finishes, and the mistake hides until a BatchNorm
is added. The fix: evaluate the bare model, model.module, which runs no collective; or evaluate
on every rank, each its share of the held-out set, then all-reduce (sum, count), as DDP step 10 does.
"""

import gc
import re
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from _launch import GAVE_UP, TIMEOUT_S, error_line, report, results, tell, told, torchrun
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(mode):  # each process of the job, started by torchrun
    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(0)  # the same data in every process
    x = torch.randn(256 + 64, 8, generator=gen)
    y = x.sum(1, keepdim=True)
    train_x, train_y = x[:256][rank::world_size], y[:256][rank::world_size]  # this rank's shard
    val_x, val_y = x[256:], y[256:]  # the whole held-out set, for rank 0's last evaluation
    kinds = {"mistake": [True], "fix": [True, False]}[mode]  # with BatchNorm; and, in the fix's job, without
    for batchnorm in kinds:
        torch.manual_seed(0)
        layers = [torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16)] if batchnorm else [torch.nn.Linear(8, 16)]
        model = DDP(torch.nn.Sequential(*layers, torch.nn.ReLU(), torch.nn.Linear(16, 1)))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for i in range(0, len(train_x), 32):
            torch.nn.functional.mse_loss(model(train_x[i : i + 32]), train_y[i : i + 32]).backward()
            optimizer.step()
            optimizer.zero_grad()
        if rank == 0:
            model.eval()
            with torch.no_grad():
                if mode == "mistake" or not batchnorm:
                    val_loss = torch.nn.functional.mse_loss(model(val_x), val_y).item()  # the wrapper
                else:
                    val_loss = torch.nn.functional.mse_loss(model.module(val_x), val_y).item()  # the fix
            tell(rank=rank, batchnorm=batchnorm, val_loss=val_loss)
        dist.barrier()  # every rank waits for rank 0's checkpoint
        tell(rank=rank, batchnorm=batchnorm, finished=True)
        del model
        gc.collect()  # torch 2.13, gloo: a DDP model alive at exit can abort the process (DDP step 7)
    dist.destroy_process_group()


def waited_in(stderr, rank):
    """The line of this file a rank of the mistake was running when it gave up: its traceback's last."""
    found = re.findall(
        rf'^\[rank{rank}\]:\s+File "{re.escape(__file__)}", line \d+, in worker\n\[rank{rank}\]:\s+(.+)$',
        stderr,
        flags=re.M,
    )
    return found[-1].split("  #")[0] if found else ""


def main():
    mistake = torchrun(__file__, "mistake")
    fix = results(torchrun(__file__, "fix"))
    where = [waited_in(mistake.stderr, r) for r in (0, 1)]
    # the first rank to give up times out; the other then times out too, or sees it leave
    timed_out = [error_line(mistake.stderr, rf"^\[rank{r}\]: {GAVE_UP}") for r in (0, 1)]
    losses = {p["batchnorm"]: p["val_loss"] for p in fix if "val_loss" in p}
    finished = {p["batchnorm"]: 0 for p in fix}
    for p in fix:
        finished[p["batchnorm"]] += "finished" in p
    report(
        mistake="if rank == 0: val_loss = mse_loss(model(val_x), val_y)  # the wrapper; then a barrier",
        symptom=f"rank 0 waits in `{where[0]}`,\nrank 1 in `{where[1]}`; after {TIMEOUT_S} s, both:\n"
        + "\n".join(timed_out),
        fix="if rank == 0: val_loss = mse_loss(model.module(val_x), val_y)  # the bare model: no collective",
        result=f"held-out loss {losses.get(True, float('nan')):.4f}, both ranks past the barrier; without"
        f" BatchNorm, model(val_x)\non rank 0 alone finishes too (no buffers to broadcast):"
        f" {losses.get(False, float('nan')):.4f}",
        checks={
            "rank 0 waited in the wrapper's forward, rank 1 in the barrier": "model(val_x)" in where[0]
            and "dist.barrier()" in where[1],
            "both ranks of the mistake failed, one by the timeout": mistake.returncode == 1
            and all(timed_out)
            and any("Timed out" in line for line in timed_out),
            "the mistake never got past the barrier": not any("finished" in p for p in told(mistake)),
            "the fix finished on both ranks, with and without BatchNorm": finished == {True: 2, False: 2},
        },
        runs=(mistake,),
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker(sys.argv[1])
    else:
        main()
