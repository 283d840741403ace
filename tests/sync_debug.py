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
step is checked: the loader's next batch, the non_blocking copy to the GPU, forward,
backward with DDP's all-reduces, the optimizer step, zero_grad, the loss summed on the
device. torch flags the syncs a script writes: copies that wait (.item(), .tolist(),
.cpu(), a blocking .to()) and stream or device synchronisations. It does not flag waits
on a CUDA event, and its docs say collectives are not covered yet; so DDP's own event
waits, which time its first 10 steps and every 100th for its runtime logs, pass unseen:
they are torch's, not the script's.

Nor does it flag a non_blocking copy from pageable memory, though the CPU waits there
too: CUDA first lets the stream's earlier work finish, then stages the copy through a
buffer of its own (the "API synchronization behavior" of CUDA's runtime docs). So the
pinning is checked apart: every batch the training loader yields inside the window must
be in page-locked memory, which the scripts ask for with pin_memory=True on a GPU.

At exit each rank reports how many optimizer steps ran wholly inside the window, how
many batches the loader yielded in it and how many of those were not pinned, so that a
test can tell a checked run from an empty window. Two canaries show that the checks
work. SYNC_DEBUG_CANARY=item: each checked step also reads a weight with .item(), the
slip the guide makes each step, and the run must fail. SYNC_DEBUG_CANARY=unpinned:
every loader drops pin_memory, as a script might, and the run passes (sync-debug mode
does not see it) but every batch it checked is reported unpinned.
"""

import atexit
import os
import runpy
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils.data import DataLoader

CANARY = os.environ.get("SYNC_DEBUG_CANARY")
steps = 0  # optimizer steps so far
checked = 0  # optimizer steps that ran wholly in the window
batches = 0  # batches the loader yielded in the window
unpinned = 0  # those of them not in page-locked memory
window_open = False


def open_window(optimizer, args, kwargs):
    global steps, checked, window_open
    if window_open:
        checked += 1
    steps += 1
    if steps >= 2:  # after the warm-up
        torch.cuda.set_sync_debug_mode("error")
        window_open = True
        if CANARY == "item":
            optimizer.param_groups[0]["params"][0].sum().item()


loader_iter = DataLoader.__iter__


def iter_check_pinned_then_close_window(self):
    global batches, unpinned, window_open
    if CANARY == "unpinned":
        self.pin_memory = False  # read as each epoch's iterator starts
    for batch in loader_iter(self):
        if window_open:
            tensors = batch if isinstance(batch, (list, tuple)) else [batch]
            batches += 1
            unpinned += not all(t.is_pinned() for t in tensors if isinstance(t, torch.Tensor))
        yield batch
    torch.cuda.set_sync_debug_mode("default")
    window_open = False


def report():
    counts = f"checked_steps={checked} checked_batches={batches} unpinned_batches={unpinned}"
    sys.stderr.write(f"SYNC_DEBUG rank={os.environ.get('RANK')} {counts}\n")


register_optimizer_step_post_hook(open_window)
DataLoader.__iter__ = iter_check_pinned_then_close_window
atexit.register(report)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
