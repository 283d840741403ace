"""A pitfall of FSDP step 6: the full state dict gathered inside `if rank == 0:`.

    python pitfalls/fsdp_step6_full_state_dict_on_rank_zero.py

get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
gathers each parameter's shards from every rank: a collective. Called by rank 0 alone, its first
all-gather meets rank 1's next one, the all-gather of the first layer in the next epoch's forward.
In torch 2.13, on gloo, their sizes differ, and gloo aborts rank 0 (SIGABRT, a C++ error with no
Python traceback) at once, not after the timeout: "Is there a distributed collective mismatch in
your code?"; rank 1 then fails on the closed connection. No checkpoint is written.
The fix: every rank gathers (with cpu_offload=True rank 0 alone gets the tensors, the others an
empty dict); rank 0 alone writes.
"""

import gc
import re
import sys
import tempfile
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from _launch import TIMEOUT_S, error_line, exit_codes, report, results, tell, told, torchrun
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard


def build_model():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def worker(mode, out_dir):  # each process of the job, started by torchrun
    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights in every process
    model = build_model()
    for layer in model:  # FSDP step 4: each Linear, then the root
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(rank)  # each rank its own batches
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    for epoch in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()  # FSDP all-gathers each layer in forward...
        loss.backward()  # ...and in backward
        optimizer.step()
        optimizer.zero_grad()
        path = f"{out_dir}/epoch_{epoch}.pt"
        if mode == "mistake":
            if rank == 0:
                state = get_model_state_dict(model, options=options)  # a collective, on rank 0 alone
                torch.save(state, path)
        else:
            state = get_model_state_dict(model, options=options)  # every rank gathers...
            if rank == 0:
                torch.save(state, path)  # ...and rank 0 alone writes
        tell(rank=rank, finished_epoch=epoch)
    del model, optimizer
    gc.collect()  # torch 2.13, gloo: a sharded model alive at exit can abort the process (pytorch#190489)
    dist.destroy_process_group()


def loads_into_the_bare_model(path):
    """Whether a checkpoint loads as the single-GPU script would load it."""
    try:
        build_model().load_state_dict(torch.load(path, weights_only=True))
    except RuntimeError:
        return False
    return True


def main():
    with tempfile.TemporaryDirectory() as out_dir:
        mistake = torchrun(__file__, "mistake", out_dir)
        mistake_files = list(Path(out_dir).iterdir())
    with tempfile.TemporaryDirectory() as out_dir:
        fix = torchrun(__file__, "fix", out_dir)
        results(fix)
        written = list(Path(out_dir).iterdir())
        loaded = sum(loads_into_the_bare_model(path) for path in written)
    codes = exit_codes(mistake)
    aborted = error_line(mistake.stderr, r"Received data size doesn't match expected size")
    aborted = aborted[aborted.find("Received") :]  # gloo's message, without its source path
    peer = error_line(mistake.stderr, r"^\[rank1\]: \w+Error: .*(closed|reset) by peer")
    peer = re.sub(r"^\[rank1\]: |\[/\S+\] Read error \S+ ", "", peer.split(" This is typically")[0])
    # the line of this file rank 1 was running when it failed: the last of its traceback here
    where = re.findall(
        rf'^\[rank1\]:\s+File "{re.escape(__file__)}", line \d+, in worker\n\[rank1\]:\s+(.+)$',
        mistake.stderr,
        flags=re.M,
    )
    epochs = [p["finished_epoch"] for p in told(mistake) if p["rank"] == 1]
    report(
        mistake="if rank == 0: state = get_model_state_dict(model, options=...full_state_dict=True...)",
        symptom=f"rank 1 finishes epoch {len(epochs)} and goes on: its next forward's all-gather meets"
        " rank 0's first gather;\ntheir sizes differ, and gloo aborts rank 0 at once (exit code"
        f" {codes.get(0)}, SIGABRT), no timeout:\n{aborted}\nrank 1, in that forward: {peer}",
        fix="state = get_model_state_dict(...) on every rank; then if rank == 0: torch.save(state, path)",
        result=f"{len(written)} checkpoints, one an epoch; {loaded} load into the bare model;"
        f" exit {fix.returncode}",
        checks={
            "gloo aborted rank 0 on the mismatch": codes.get(0) == -6 and "collective mismatch" in aborted,
            "rank 1 failed on the lost connection, in its forward": codes.get(1) is not None
            and peer != ""
            and where[-1:] != []
            and where[-1].startswith("loss = model("),
            "no rank waited for the timeout": "Timed out" not in mistake.stderr,
            "rank 1 finished one epoch, rank 0 none, and no file was written": epochs == [0]
            and all(p["rank"] == 1 for p in told(mistake))
            and mistake_files == [],
            "the fix wrote every epoch's checkpoint, each loads": loaded == len(written) == 3,
        },
        runs=(mistake, fix),
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker(*sys.argv[1:])
    else:
        main()
