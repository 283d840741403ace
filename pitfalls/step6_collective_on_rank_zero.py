"""A pitfall of DDP step 6: a collective inside `if rank == 0:`.

    python pitfalls/step6_collective_on_rank_zero.py

Rank 0 saves the checkpoint, and the save routine ends with dist.barrier(). Only rank 0
reaches that barrier; rank 1 goes on to the next epoch and waits in DDP's next
collective. Each waits for the other: the job hangs until the process group's timeout
(30 minutes by default, 10 with nccl; 3 s here).
"""

import gc
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
from _launch import GAVE_UP, TIMEOUT_S, error_line, report, tell, told, torchrun
from torch.nn.parallel import DistributedDataParallel as DDP


def worker(mode, out_dir):  # each process of the job, started by torchrun
    def save_checkpoint(model, path):
        torch.save(model.module.state_dict(), path)
        dist.barrier()  # "wait until the file is written": a collective, every rank must call it

    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    torch.manual_seed(rank)  # each rank its own batches
    model = DDP(torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        model(torch.randn(8, 4)).pow(2).mean().backward()  # DDP all-reduces the gradients here
        optimizer.step()
        optimizer.zero_grad()
        path = f"{out_dir}/epoch_{epoch}.pt"
        if mode == "mistake":
            if rank == 0:
                save_checkpoint(model, path)  # the barrier inside is reached by rank 0 alone
        else:
            if rank == 0:
                torch.save(model.module.state_dict(), path)  # only rank 0 writes...
            dist.barrier()  # ...and every rank waits for it, outside the `if`
        tell(rank=rank, finished_epoch=epoch)
    del model
    gc.collect()  # torch 2.13, gloo: a DDP model alive at exit can abort the process (DDP step 7)
    dist.destroy_process_group()


def main():
    with tempfile.TemporaryDirectory() as out_dir:
        mistake = torchrun(__file__, "mistake", out_dir)
    with tempfile.TemporaryDirectory() as out_dir:
        fix = torchrun(__file__, "fix", out_dir)
    # the first rank to give up times out; the other then times out too, or sees it leave
    timed_out = [error_line(mistake.stderr, rf"^\[rank{r}\]: {GAVE_UP}") for r in (0, 1)]
    finished = sum(p["finished_epoch"] == 2 for p in told(fix))
    report(
        mistake="if rank == 0: save_checkpoint(model, path)  # which ends with dist.barrier()",
        symptom=f"rank 0 waits in that barrier, rank 1 in DDP's next step; after {TIMEOUT_S} s, both:\n"
        + "\n".join(timed_out),
        fix="if rank == 0: torch.save(...); then dist.barrier() on every rank, outside the `if`",
        result=f"{finished} of 2 ranks finished all 3 epochs, exit {fix.returncode}",
        checks={
            "both ranks of the mistake failed, one by the timeout": mistake.returncode == 1
            and all(timed_out)
            and any("Timed out" in line for line in timed_out),
            "the mistake never finished an epoch on rank 0": all(p["rank"] != 0 for p in told(mistake)),
            "the fix finished": fix.returncode == 0 and finished == 2,
        },
        runs=(mistake, fix),
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker(*sys.argv[1:])
    else:
        main()
