"""Run a training script and report, on each rank, the most of its model it ever held whole at once.

    torchrun ... tests/whole_model.py train_fsdp.py [flags]
    python tests/whole_model.py single_gpu_baseline.py [flags]

The script runs unchanged. Every module it builds is noted (nn.Module.__init__ is wrapped), and after
every operation the process runs (a TorchDispatchMode sees each, from the first to the last) the
numbers its modules hold whole are counted: a parameter that is a plain tensor with memory, as a
module built on a device holds it, and as FSDP2 holds a block's weights while the block computes
(it gathers them into plain tensors, and puts its shards back after); not one on the meta device
(a shape, no memory), nor a DTensor (FSDP2's shard: 1/N of it on this rank). Each rank prints one line
on stderr at its exit, `WHOLE_MODEL {json}`: the model's parameters (numbers), the most its modules
held whole at once, and which modules held them then.

What it counts is what the model's modules hold, not a checkpoint's copy of them: a whole file read
on rank 0, or the last epoch's gathered there to be written, is a state dict, not the model.
"""

import atexit
import json
import os
import runpy
import sys
import weakref

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode

modules = []  # weak references to every module the script built, in the order it built them
init = torch.nn.Module.__init__


def noting_init(self, *args, **kwargs):
    init(self, *args, **kwargs)
    modules.append(weakref.ref(self))


torch.nn.Module.__init__ = noting_init
most = {"whole": 0, "holding": []}
sizes = {}  # module's place among those built: the numbers of its own parameters, whole or not


def whole_now():
    """{module's place among those built: the numbers it holds whole} of the modules alive now."""
    held = {}
    for number, ref in enumerate(modules):
        module = ref()
        params = [] if module is None else [p for p in module._parameters.values() if p is not None]
        if params:
            sizes[number] = sum(p.numel() for p in params)  # a DTensor's numel is the whole tensor's
        whole = sum(p.numel() for p in params if not p.is_meta and not isinstance(p, DTensor))
        if whole:
            held[number] = whole
    return held


class Watch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        held = whole_now()
        if sum(held.values()) > most["whole"]:
            most.update(whole=sum(held.values()), holding=sorted(held))
        return out


def report():
    line = {
        "rank": int(os.environ.get("RANK", 0)),
        "parameters": sum(sizes.values()),
        "blocks": sizes,  # the modules that hold parameters of their own: each one's numbers
        "most_whole": most["whole"],
        "holding": most["holding"],
    }
    sys.stderr.write(f"WHOLE_MODEL {json.dumps(line)}\n")


atexit.register(report)
watch = Watch()
watch.__enter__()  # from the script's first operation to its last
atexit.register(watch.__exit__, None, None, None)  # runs before report (last registered, first run)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
