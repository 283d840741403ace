"""A pitfall of FSDP step 10: evaluation through the sharded model on rank 0 alone.

    python pitfalls/fsdp_step10_evaluate_on_rank_zero.py

With DDP, model.module's forward runs no collective, and rank 0 could evaluate it alone. The model
fully_shard returns has no such module: its forward all-gathers each layer's parameters from every
rank, a collective. Run by rank 0 alone, nothing fails there, in torch 2.13 on gloo: rank 0's
all-gathers meet those of rank 1's next training forward, the same layers in the same order, so
the first validation loss is even right. From then the two ranks' collectives are out of step: in
the next epoch's training they meet collectives of other sizes, gloo aborts rank 1 (SIGABRT, a C++
error with no Python traceback: "Is there a distributed collective mismatch in your code?"), and
rank 0 fails on the closed connection in its training forward, at once, not after the timeout.
The fix: every rank evaluates its shard of the validation set, then one all-reduce of
(loss sum, count) gives every rank the loss over the whole set.
"""

import gc
import re
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from _launch import TIMEOUT_S, error_line, exit_codes, report, results, tell, told, torchrun
from torch.distributed.fsdp import fully_shard

EPOCHS = 3


def worker(mode):  # each process of the job, started by torchrun
    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    rank, world_size = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(0)  # the same data in every process
    x = torch.randn(512 + 64, 10, generator=gen)
    y = x @ torch.randn(10, 1, generator=gen) + 0.1 * torch.randn(len(x), 1, generator=gen)
    train_x, train_y = x[:512][rank::world_size], y[:512][rank::world_size]  # this rank's shard
    val_x, val_y = x[512:], y[512:]  # the whole validation set
    torch.manual_seed(0)  # the same initial weights in every process
    model = torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    for layer in model:  # FSDP step 4: each Linear, then the root
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(1, EPOCHS + 1):
        for i in range(0, len(train_x), 64):
            loss = torch.nn.functional.mse_loss(model(train_x[i : i + 64]), train_y[i : i + 64])
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        tell(rank=rank, trained=epoch)
        if mode == "mistake":
            if rank == 0:
                with torch.no_grad():  # the sharded model's forward all-gathers: a collective
                    val_loss = torch.nn.functional.mse_loss(model(val_x), val_y).item()
                tell(rank=rank, epoch=epoch, val_loss=val_loss)
        else:
            mine_x, mine_y = val_x[rank::world_size], val_y[rank::world_size]  # this rank's shard
            with torch.no_grad():  # every rank runs the forward, so its all-gathers meet
                val = torch.stack([((model(mine_x) - mine_y) ** 2).sum(), torch.tensor(float(len(mine_x)))])
            dist.all_reduce(val)  # (loss sum, count) over the whole validation set
            tell(rank=rank, epoch=epoch, val_loss=(val[0] / val[1]).item())
    del model, optimizer
    gc.collect()  # torch 2.13, gloo: a sharded model alive at exit can abort the process (pytorch#190489)
    dist.destroy_process_group()


def losses(said, rank):
    return [p["val_loss"] for p in said if p["rank"] == rank and "val_loss" in p]


def main():
    mistake = torchrun(__file__, "mistake")
    fix = results(torchrun(__file__, "fix"))
    said = told(mistake)
    trained = {
        r: max([p["trained"] for p in said if p["rank"] == r and "trained" in p], default=0) for r in (0, 1)
    }
    codes = exit_codes(mistake)
    aborted = error_line(mistake.stderr, r"Received data size doesn't match expected size")
    aborted = aborted[aborted.find("Received") :]  # gloo's message, without its source path
    peer = error_line(mistake.stderr, r"^\[rank0\]: \w+Error: .*(closed|reset) by peer")
    peer = re.sub(r"^\[rank0\]: |\[/\S+\] Read error \S+ ", "", peer.split(" This is typically")[0])
    # the line of this file rank 0 was running when it failed: the last of its traceback here
    where = re.findall(
        rf'^\[rank0\]:\s+File "{re.escape(__file__)}", line \d+, in worker\n\[rank0\]:\s+(.+)$',
        mistake.stderr,
        flags=re.M,
    )
    where = where[-1] if where else ""
    first, fixed = losses(said, 0), losses(fix, 0)
    report(
        mistake="if rank == 0: val_loss = mse_loss(model(val_x), val_y)  # the sharded model's forward",
        symptom="no error there: rank 0's all-gathers meet those of rank 1's next training forward, and"
        f" epoch 1's loss\nis right ({first[0] if first else float('nan'):.4f}, the fix's {fixed[0]:.4f});"
        " from then the ranks are out of step, and in epoch 2,\nwith no timeout, gloo aborts rank 1"
        f" (exit code {codes.get(1)}, SIGABRT):\n{aborted}\nrank 0, in its next training forward: {peer}",
        fix="every rank: (loss sum, count) of its shard of the validation set; then dist.all_reduce of them",
        result="both ranks, after each epoch: " + ", ".join(f"{v:.4f}" for v in fixed) + "; exit 0",
        checks={
            "the mistake's first evaluation ran, and is the fix's": len(first) == 1
            and abs(first[0] - fixed[0]) < 1e-5 * fixed[0],
            "gloo aborted rank 1 on the mismatch": codes.get(1) == -6 and "collective mismatch" in aborted,
            "rank 0 failed on the lost connection, in a training step": peer != ""
            and "model(train_x" in where,
            "both ranks trained one epoch, and no rank waited for the timeout": trained == {0: 1, 1: 1}
            and "Timed out" not in mistake.stderr,
            "the fix's ranks agree, every epoch": losses(fix, 1) == fixed and len(fixed) == EPOCHS,
        },
        runs=(mistake,),
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker(sys.argv[1])
    else:
        main()
