"""Run a training script and report what each rank holds: the bytes of its parameters, their
gradients and the optimizer's state, as live tensors, at its first optimizer step.

    torchrun ... benchmarks/state_bytes.py train_fsdp.py [flags]
    python benchmarks/state_bytes.py single_gpu_baseline.py [flags]

The script runs unchanged: the optimizer's step is wrapped, and after the first one (gradients
still there, zero_grad comes after it; the momentum buffers made by it) every tensor the optimizer
holds is counted: a DTensor (FSDP2's shards) by its local shard, the part this rank stores. Each
rank prints one line on stderr at its exit, `STATE_BYTES {json}`. Only what the optimizer holds is
counted: not DDP's gradient buckets (a second copy of the gradients), nor the whole weights FSDP2
all-gathers for a moment around each block's compute, nor activations."""

import atexit
import json
import os
import runpy
import sys

import torch
from torch.distributed.tensor import DTensor

held = {}
sgd_step = torch.optim.SGD.step


def stored(tensor):
    """The bytes this rank stores of a tensor: a DTensor's local shard, else the tensor."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.numel() * local.element_size()


def step_and_count(self, *args, **kwargs):
    result = sgd_step(self, *args, **kwargs)
    if not held:
        params = [p for group in self.param_groups for p in group["params"]]
        held["params"] = sum(stored(p) for p in params)
        held["grads"] = sum(stored(p.grad) for p in params if p.grad is not None)
        held["state"] = sum(
            stored(value)
            for state in self.state.values()
            for value in state.values()
            if isinstance(value, torch.Tensor)
        )
    return result


torch.optim.SGD.step = step_and_count
atexit.register(
    lambda: sys.stderr.write(f"STATE_BYTES {json.dumps({'rank': int(os.environ.get('RANK', 0)), **held})}\n")
)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
