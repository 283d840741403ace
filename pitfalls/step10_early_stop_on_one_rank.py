"""A pitfall of DDP step 10: early stopping decided by each rank on its own validation loss.

    python pitfalls/step10_early_stop_on_one_rank.py

Each rank evaluates its own shard of the validation set, so each sees a different loss
and stops at a different epoch. The rank that stops first waits in the collective after
the loop; the other waits in its next epoch's gradient all-reduce. The job hangs until
the process group's timeout (30 minutes by default, 10 with nccl; 3 s here).
The fix all-reduces the validation loss, (sum, count), so every rank decides on the
same number (all-reducing the decision itself, with ReduceOp.MAX, works too).
"""

import gc
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from _launch import GAVE_UP, TIMEOUT_S, error_line, report, results, tell, told, torchrun
from torch.nn.parallel import DistributedDataParallel as DDP

PATIENCE, MAX_EPOCHS = 2, 20


def worker(mode):  # each process of the job, started by torchrun
    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(0)  # the same data in every process
    x = torch.randn(512 + 32, 10, generator=gen)
    y = x @ torch.randn(10, 1, generator=gen) + torch.randn(len(x), 1, generator=gen)
    train_x, train_y = x[:512][rank::world_size], y[:512][rank::world_size]  # this rank's shards
    val_x, val_y = x[512:][rank::world_size], y[512:][rank::world_size]
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(10, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    best, bad_epochs = float("inf"), 0
    for epoch in range(MAX_EPOCHS):
        for i in range(0, len(train_x), 64):
            torch.nn.functional.mse_loss(model(train_x[i : i + 64]), train_y[i : i + 64]).backward()
            optimizer.step()
            optimizer.zero_grad()
        with torch.no_grad():
            val = torch.stack([((model.module(val_x) - val_y) ** 2).sum(), torch.tensor(float(len(val_x)))])
        if mode == "fix":
            dist.all_reduce(val)  # every rank now holds the loss over the whole validation set
        val_loss = (val[0] / val[1]).item()
        if val_loss < best - 1e-3:
            best, bad_epochs = val_loss, 0
        else:
            bad_epochs += 1
        if bad_epochs >= PATIENCE:
            tell(rank=rank, epochs=epoch + 1)  # this rank leaves the loop
            break
    dist.barrier()  # every rank is done; then rank 0 would save the final model
    del model
    gc.collect()  # torch 2.13, gloo: a DDP model alive at exit can abort the process (DDP step 7)
    dist.destroy_process_group()


def main():
    mistake = torchrun(__file__, "mistake")
    fix = results(torchrun(__file__, "fix"))
    left = told(mistake)
    stopped = ", ".join(f"rank {p['rank']} leaves the loop after epoch {p['epochs']}" for p in left)
    # the first rank to give up times out; the other then times out too, or sees it leave
    timed_out = [error_line(mistake.stderr, rf"^\[rank{r}\]: {GAVE_UP}") for r in (0, 1)]
    report(
        mistake="if bad_epochs >= patience: break  # on this rank's own validation loss",
        symptom=f"{stopped}; it waits in the barrier after the loop, the other rank in its\n"
        f"next epoch's gradient all-reduce; after {TIMEOUT_S} s, both:\n" + "\n".join(timed_out),
        fix="dist.all_reduce(val)  # (loss sum, count): every rank decides on the same validation loss",
        result=f"both ranks stop after epoch {fix[0]['epochs']} and finish, exit 0",
        checks={
            "one rank of the mistake left the loop, the other did not": len(left) == 1,
            "both ranks of the mistake failed, one by the timeout": mistake.returncode == 1
            and all(timed_out)
            and any("Timed out" in line for line in timed_out),
            "the fix's ranks stopped together": len(fix) == 2 and len({p["epochs"] for p in fix}) == 1,
        },
        runs=(mistake,),
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker(sys.argv[1])
    else:
        main()
