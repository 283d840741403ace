"""Run a training script with one injected fault: the crash tests' tool, kept out of the scripts.

    torchrun --max-restarts=1 ... tests/fault.py FAULT train_ddp.py [flags]

FAULT is one of, acting in torchrun's first attempt only (a restart runs clean):
    kill@RANK:STEP  the process of global RANK kills itself with SIGKILL at its STEP-th optimizer step
    raise@RANK:STEP it raises an exception there instead
    cut@EPOCH       rank 0 dies with SIGKILL half-way through writing model_epoch_EPOCH.pt
"""

import os
import runpy
import signal
import sys

import torch

fault, script, *flags = sys.argv[1:]
kind, _, where = fault.partition("@")
armed = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") == "0"
rank = int(os.environ.get("RANK", "0"))
steps = 0

if kind in ("kill", "raise"):
    fault_rank, fault_step = map(int, where.split(":"))
    sgd_step = torch.optim.SGD.step

    def step_with_fault(self, *args, **kwargs):
        global steps
        steps += 1
        if armed and rank == fault_rank and steps == fault_step:
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected fault at step {steps} of rank {rank}")
        return sgd_step(self, *args, **kwargs)

    torch.optim.SGD.step = step_with_fault
elif kind == "cut":
    save = torch.save

    def save_with_fault(obj, f, *args, **kwargs):
        save(obj, f, *args, **kwargs)
        if armed and str(f).endswith(f"model_epoch_{where}.pt.tmp"):
            with open(f, "r+b") as file:
                file.truncate(os.path.getsize(f) // 2)
            os.kill(os.getpid(), signal.SIGKILL)

    torch.save = save_with_fault
else:
    sys.exit(f"unknown fault {fault!r}")

sys.argv = [script, *flags]
runpy.run_path(script, run_name="__main__")
