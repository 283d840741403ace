"""Run a training script on a GPU with every host synchronisation inside its training steps made an error.

    torchrun ... tests/sync_debug.py train_ddp.py --device cuda [flags]

A host synchronisation (an .item(), a .cpu(), a blocking copy) makes the CPU wait for
the GPU to catch up; once a step, it leaves the GPU idle while the CPU prepares the
next one. torch.cuda.set_sync_debug_mode("error") makes torch raise on one instead.
The mode is one setting for the whole process, so this wrapper switches it on and off
around the steady-state training steps only:

- on after each optimizer step (a global step post-hook), from the run's second step
  on. The first two steps are warm-up, with one-time syncs that no later step repeats:
  CUDA and cuBLAS set themselves up in the first, and the forward after the first
  backward rebuilds DDP's gradient buckets in the order the gradients came, and
  broadcasts that order from rank 0 (a copy back to the host).
- off when the training DataLoader runs out, that is, as the epoch's loop ends and
  before the code after it: the all-reduce of the epoch's loss sums and their
  .tolist(), a sync once an epoch by design, then evaluation and checkpoints.

So from the second step of each epoch (the third of the first) to its last, all of a
step is checked: the loader's next batch and its pinning, the non_blocking copy to the
GPU, forward, backward with DDP's all-reduces, the optimizer step, zero_grad, the loss
summed on the device. torch flags the syncs a script writes: copies that wait (.item(),
.tolist(), .cpu(), a blocking .to()) and stream or device synchronisations. It does not
flag waits on a CUDA event, and its docs say collectives are not covered yet; so DDP's
own event waits, which time its first 10 steps and every 100th for its runtime logs,
pass unseen: they are torch's, not the script's.

At exit each rank reports how many optimizer steps ran wholly inside the window, so
that a test can tell a checked run from an empty window. With SYNC_DEBUG_CANARY=1 each
checked step also reads a weight with .item(), the slip the guide makes each step: the
run must then fail, which shows the window works.
"""

import atexit
import os
import runpy
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader

steps = 0  # optimizer steps so far
checked = 0  # optimizer steps that ran wholly in the window
window_open = False


def open_window(optimizer, args, kwargs):
    global steps, checked, window_open
    if window_open:
        checked += 1
    steps += 1
    if steps >= 2:  # after the warm-up
        torch.cuda.set_sync_debug_mode("error")
        window_open = True
        if os.environ.get("SYNC_DEBUG_CANARY") == "1":
            optimizer.param_groups[0]["params"][0].sum().item()


loader_iter = DataLoader.__iter__


def iter_then_close_window(self):
    global window_open
    yield from loader_iter(self)
    torch.cuda.set_sync_debug_mode("default")
    window_open = False


register_optimizer_step_post_hook(open_window)
DataLoader.__iter__ = iter_then_close_window
atexit.register(
    lambda: sys.stderr.write(f"SYNC_DEBUG rank={os.environ.get('RANK')} checked_steps={checked}\n")
)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
