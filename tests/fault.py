"""Run a training script with one injected fault: the fault tests' tool, kept out of the scripts.

    torchrun --max-restarts=1 ... tests/fault.py FAULT train_ddp.py [flags]

FAULT is one of, acting in torchrun's first attempt only (a restart runs clean):
    kill@RANK:STEP  the process of global RANK kills itself with SIGKILL at its STEP-th optimizer step
    raise@RANK:STEP it raises an exception there instead
    cut@EPOCH       rank 0 dies with SIGKILL half-way through writing model_epoch_EPOCH.pt; of a
                    sharded checkpoint (train_fsdp.py's folder model_epoch_EPOCH), the last rank
                    dies so, its shards' file cut to half before it is on disk: the folder is never
                    completed (no other rank can)
    full@EPOCH      the disk fills up half-way through writing model_epoch_EPOCH.pt (ENOSPC)
    stale@RANK      the process of global RANK lists --out_dir without its newest checkpoint, as a
                    node with a stale view of a shared filesystem may
    syncs           report each os.fsync and os.replace on stderr, in order
    hold            rank 0 holds still after it has saved model_epoch_1.pt, until a file named
                    "release" appears in the working folder (so a test can act on a running job)

A fault that fires says so on stderr, `fault.py: FAULT fired: what it did`, so that a test can tell
a run that met its fault from one that did not (helpers.assert_fired). FAULT_OFF=KIND (or several,
comma-separated) turns off the faults of those kinds, and the script runs clean: the meta-test
(test_faults.py) runs each fault's tests so, and sees them fail.
"""

import errno
import os
import pathlib
import runpy
import signal
import sys
import time

import torch

fault, script, *flags = sys.argv[1:]
kind, _, where = fault.partition("@")
armed = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
rank = int(os.environ.get("RANK", "0"))
steps = 0


def fired(what):
    """Say that the fault acted, before it acts (a SIGKILL leaves no time after)."""
    sys.stderr.write(f"fault.py: {fault} fired: {what}\n")
    sys.stderr.flush()


if kind in os.environ.get("FAULT_OFF", "").split(","):
    sys.stderr.write(f"fault.py: {fault} is off (FAULT_OFF): the script runs clean\n")
elif kind in ("kill", "raise"):
    fault_rank, fault_step = map(int, where.split(":"))
    sgd_step = torch.optim.SGD.step

    def step_with_fault(self, *args, **kwargs):
        global steps
        steps += 1
        if armed and rank == fault_rank and steps == fault_step:
            fired(f"rank {rank} at its optimizer step {steps}")
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected fault at step {steps} of rank {rank}")
        return sgd_step(self, *args, **kwargs)

    torch.optim.SGD.step = step_with_fault
elif kind in ("cut", "full"):
    save = torch.save

    class FullDisk:
        """A file whose disk fills up after its first kilobyte."""

        def __init__(self, file):
            self.file, self.written = file, 0

        def write(self, data):
            self.written += len(data)
            if self.written > 1024:
                fired(f"no space left after {self.written - len(data)} bytes of {self.file.name}")
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self.file.write(data)

        def __getattr__(self, name):
            return getattr(self.file, name)

    def save_with_fault(obj, f, *args, **kwargs):
        name = getattr(f, "name", str(f))
        hit = armed and str(name).endswith(f"model_epoch_{where}.pt.tmp")
        if hit and kind == "full":
            return save(obj, FullDisk(f), *args, **kwargs)
        save(obj, f, *args, **kwargs)
        if hit:  # cut
            f.flush()
            size = os.path.getsize(name)
            os.truncate(name, size // 2)
            fired(f"{name} cut to {size // 2} of its {size} bytes; rank {rank} killed with SIGKILL")
            os.kill(os.getpid(), signal.SIGKILL)

    torch.save = save_with_fault
    fsync = os.fsync
    last = rank == int(os.environ.get("WORLD_SIZE", "1")) - 1

    def fsync_with_fault(fd):
        name = os.readlink(f"/proc/self/fd/{fd}")  # DCP syncs each rank's file once it is written
        if armed and kind == "cut" and last and f"/model_epoch_{where}/__{rank}_" in name:
            size = os.path.getsize(name)
            os.truncate(name, size // 2)
            fired(f"{name} cut to {size // 2} of its {size} bytes; rank {rank} killed with SIGKILL")
            os.kill(os.getpid(), signal.SIGKILL)
        return fsync(fd)

    os.fsync = fsync_with_fault
elif kind == "stale":
    glob = pathlib.Path.glob

    def stale_glob(self, pattern, *args, **kwargs):
        found = sorted(glob(self, pattern, *args, **kwargs))
        if rank == int(where) and pattern == "model_epoch_*.pt" and found:
            newest = max(found, key=lambda p: int(p.stem.split("_")[-1]))
            found.remove(newest)
            fired(f"rank {rank} lists {self} without {newest.name}")
        return iter(found)

    pathlib.Path.glob = stale_glob
elif kind == "syncs":
    fsync, replace = os.fsync, os.replace

    def traced_fsync(fd):
        if not getattr(traced_fsync, "fired", False):
            traced_fsync.fired = True
            fired("each os.fsync and os.replace is reported below")
        sys.stderr.write(f"FSYNC {os.readlink(f'/proc/self/fd/{fd}')}\n")
        return fsync(fd)

    def traced_replace(src, dst, *args, **kwargs):
        sys.stderr.write(f"REPLACE {os.path.abspath(src)} {os.path.abspath(dst)}\n")
        return replace(src, dst, *args, **kwargs)

    os.fsync, os.replace = traced_fsync, traced_replace
elif kind == "hold":
    replace = os.replace

    def replace_then_hold(src, dst, *args, **kwargs):
        replace(src, dst, *args, **kwargs)
        if str(dst).endswith("model_epoch_1.pt"):
            fired(f"rank {rank} holds after saving {dst}, until ./release exists")
            while not os.path.exists("release"):
                time.sleep(0.1)

    os.replace = replace_then_hold
else:
    sys.exit(f"unknown fault {fault!r}")

sys.argv = [script, *flags]
runpy.run_path(script, run_name="__main__")
