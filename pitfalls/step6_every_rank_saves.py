"""A pitfall of DDP step 6: every rank saves the checkpoint, to one file.

    python pitfalls/step6_every_rank_saves.py

The replicas are equal, so one copy is all there is to save; N processes that each save it write
one file N times, at the same moment (they leave the epoch's all-reduce together). With the safe
save, a temporary file renamed into place, the first rename takes the temporary file and the next
finds none: that rank stops with FileNotFoundError, and the job with it. With a plain torch.save,
the N writes contend for the file, and one whose contents differ by rank (an RNG state, the rank's
own loss) ends as whichever rank wrote last, or torn. A save under `if local_rank == 0:` is the same
mistake on several nodes: one writer a node.
"""

import gc
import os
import re
import sys
import tempfile

import torch
import torch.distributed as dist
from _launch import error_line, report, results, tell, told, torchrun
from torch.nn.parallel import DistributedDataParallel as DDP


def save(state, path, together=False):
    """The safe save: write a temporary file, then rename it over the checkpoint, so that a crash
    mid-write leaves the previous checkpoint whole."""
    torch.save(state, f"{path}.tmp")
    if together:  # ranks that save at once reach the rename at once: made exact here, by a barrier
        dist.barrier()
    os.replace(f"{path}.tmp", path)


def worker(mode, out_dir):  # each process of the job, started by torchrun
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(torch.nn.Linear(4, 1))
    path = f"{out_dir}/ckpt.pt"
    if mode == "mistake":
        save(model.module.state_dict(), path, together=True)  # every rank: the first rename takes the file
    else:
        if rank == 0:
            save(model.module.state_dict(), path)  # rank 0 alone writes...
        dist.barrier()  # ...and every rank waits for the file, outside the `if`
    tell(rank=rank, saved=True)
    del model
    gc.collect()  # torch 2.13, gloo: a DDP model alive at exit can abort the process (DDP step 7)
    dist.destroy_process_group()


def main():
    with tempfile.TemporaryDirectory() as out_dir:
        mistake = torchrun(__file__, "mistake", out_dir)
    with tempfile.TemporaryDirectory() as out_dir:
        fix = torchrun(__file__, "fix", out_dir)
        results(fix)
        keys = list(torch.load(f"{out_dir}/ckpt.pt", weights_only=True))
    failed = error_line(mistake.stderr, r"^\[rank\d\]: FileNotFoundError: ")
    failed = re.sub(r"'/\S+/(ckpt\.pt\S*)'", r"'\1'", failed) or "no rank failed"  # paths as from out_dir
    report(
        mistake="save(model.module.state_dict(), path)  # on every rank; save: a temporary file, renamed",
        symptom=f"a rank's rename finds its file gone; the job stops, exit {mistake.returncode}:\n{failed}",
        fix="if dist.get_rank() == 0: save(...); then dist.barrier() on every rank, outside the `if`",
        result=f"rank 0 alone wrote ckpt.pt, which loads ({', '.join(keys)}); exit {fix.returncode}",
        checks={
            "the mistake stopped a rank at its rename": mistake.returncode != 0
            and "FileNotFoundError" in failed,
            "the fix finished on every rank, and its checkpoint loads": fix.returncode == 0
            and len(told(fix)) == 2
            and keys == ["weight", "bias"],
        },
        runs=(mistake, fix),
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker(*sys.argv[1:])
    else:
        main()
