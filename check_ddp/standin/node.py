"""2b. the stand-in: CUDA and NCCL on the CPU, so that a GPU script runs unchanged on a laptop.

Where the job has fewer GPUs than processes (or --cpu), each process is shown the GPUs of its node (as
many as its node's processes) and runs on the CPU: a GPU the script asks for becomes the CPU (and is
recorded, with the line), nccl becomes gloo, torch.cuda answers as a GPU would as far as training goes.
A tensor the script puts "on a GPU" keeps its GPU beside it: so the judge knows where the model and the
batches would be. These are wrappers of the calls that name a device, not a TorchFunctionMode (as
torch.utils._device.DeviceContext is): a mode sees every torch call, and a pass-through one measured +56%
a step on a small model here; the calls that name a device cost the same with or without the stand-in.

The stand-in is one object, StandIn (this module), with a state of its own, and what it puts in torch's
place is declared as the watcher's wrappers are (stands_in, replaces: WRAPPERS, looked up by
missing_names): torch.cuda's answers (cuda.py), the calls that name a device (devices.py), and NCCL
(nccl.py). It says what it stood in for in records of its own ("gpu", "input", "ddp_gpus", device_count
read); the watcher never reads its state, and the judge reads both from the records."""

import contextlib
import os
import time
import types

from ..watch.frames import where
from ..watch.recorder import Beside, Quietly


class StandIn:
    """A GPU node, for one process of the job, on the CPU: how many GPUs its node has, which one is
    current, where each tensor the script put "on a GPU" is, and the hook it keeps on each model the
    script put on one, until that model's first batch."""

    def __init__(self, rec, node_gpus):
        import torch

        self.rec, self.node_gpus = rec, node_gpus
        # the node's GPUs this process sees, as CUDA decides at its first use: all of them, or those the
        # script names in CUDA_VISIBLE_DEVICES before that (one a process: cuda:0 is then its own GPU)
        self.launch_visible, self.seen = os.environ.get("CUDA_VISIBLE_DEVICES"), None
        self.chosen = None  # the current GPU, if the script chose it (set_device), by its number on the node
        self.meshes = Beside()  # each device mesh the script made of GPUs (stood in by one of CPUs)
        self.asked = set()  # (how, GPU, line) already recorded
        self.counted = False  # torch.cuda.device_count() read by the script: recorded once
        self.tags = Beside()  # the GPU of each tensor the script put "on a GPU", kept beside it
        self.hooks = Beside()  # each model put on a GPU: the hook waiting for its first batch, then None
        self.fed = Beside()  # each DDP model whose first training batch is recorded
        self.faults = set()  # where its own bookkeeping failed (Quietly)
        self.rng_state = torch.zeros(16, dtype=torch.uint8)  # a GPU's random generator's state
        self.autocast, self.scaler = autocast_on_cpu(torch), grad_scaler_on_cpu(torch)
        # torch.compile traces none of its bookkeeping on a DDP forward
        self.note_input = torch.compiler.disable(self.note_input)

    @property
    def gpu(self):
        """The current GPU, by its number on the node: the one the script set, else the first it sees."""
        return self.chosen if self.chosen is not None else (self.visible() or [0])[0]

    def placed(self, tensor):
        """Where a tensor is, for the script: the GPU it asked for, else its device."""
        index = self.tags.get(tensor)
        return f"cuda:{index}" if index is not None else str(tensor.device)

    def on_gpu(self, tensor, index):
        self.tags.set(tensor, index)
        return tensor

    def index(self, device):
        """The GPU a device names (an int, "cuda", "cuda:1", torch.device), or None if not a GPU."""
        import torch

        if isinstance(device, int) and not isinstance(device, bool):
            return self.on_node(device)
        if isinstance(device, str):
            if not device.startswith("cuda"):
                return None
            try:
                device = torch.device(device)
            except RuntimeError:  # torch refuses it ("cuda:-1") on GPUs too: the script's call's error
                self.record(None, "device", refused="invalid")
                raise
        if isinstance(device, torch.device) and device.type == "cuda":
            return self.gpu if device.index is None else self.on_node(device.index)
        return None

    def visible(self):
        """The node's GPUs this process sees, by their numbers on the node: fixed at the first use, as
        CUDA reads CUDA_VISIBLE_DEVICES once. Where the script set it (to its own GPU, before any GPU
        use), those it lists, up to the first that is not one of the node's, as CUDA reads the list."""
        if self.seen is None:
            listed = os.environ.get("CUDA_VISIBLE_DEVICES")
            self.seen = list(range(self.node_gpus))
            if listed != self.launch_visible and listed is not None:
                self.seen = []
                for item in listed.split(","):
                    if not item.strip().isdigit() or int(item) >= self.node_gpus or int(item) in self.seen:
                        break
                    self.seen.append(int(item))
        return self.seen

    def on_node(self, index):
        """The node's GPU that the script's cuda:index is (the index-th it sees); one past those it sees
        stays past the node's, where ask() refuses it as CUDA does."""
        seen = self.visible()
        if 0 <= index < len(seen):
            return seen[index]
        return index if index < 0 else index + self.node_gpus - len(seen)

    def shown(self, gpu):
        """The number the script knows the node's GPU by (torch.cuda.current_device())."""
        seen = self.visible()
        return seen.index(gpu) if gpu in seen else gpu

    def record(self, index, how, refused=None):
        """A GPU asked for, and whether it was refused, recorded once a way and line."""
        at = where()
        if (how, index, at) not in self.asked:
            self.asked.add((how, index, at))
            self.rec.add("gpu", how=how, index=index, at=at, **({"refused": refused} if refused else {}))

    def ask(self, index, how):
        """The script asks for a GPU: recorded (once a way and line); one its node lacks fails, as
        CUDA's own "invalid device ordinal" does, and a negative index as torch's own check does."""
        gpus = self.node_gpus
        self.record(index, how, refused="negative" if index < 0 else "past_node" if index >= gpus else None)
        if index < 0:
            raise RuntimeError(f"Device index must not be negative (check_ddp: cuda:{index} asked)")
        if index >= gpus:
            seen = len(self.visible())
            sees = f"this node has {gpus} GPU{'s' if gpus > 1 else ''}"
            if seen < gpus:  # the script's CUDA_VISIBLE_DEVICES
                sees = f"this process sees {seen} of its node's {gpus} GPUs (CUDA_VISIBLE_DEVICES)"
            raise RuntimeError(
                f"CUDA error: invalid device ordinal (check_ddp: cuda:{index - gpus + seen} asked, and "
                f"{sees}, cuda:0 to cuda:{seen - 1})"
            )
        return index

    def wait_for_first_batch(self, model):
        """A model put on a GPU: where its first batch comes from is recorded (once a model)."""
        with Quietly(self):
            if self.hooks.get(model, False) is False:
                self.hooks.set(model, model.register_forward_pre_hook(self.first_input))

    def first_input(self, module, args):
        """A model on a GPU gets its first batch: where that batch is (on a GPU, both must be on one)."""
        import torch

        with Quietly(self):
            self.drop_hook(module)
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is not None:
                model = self.placed(next(module.parameters(), first))
                self.rec.add("input", device=self.placed(first), model=model, at=where())

    def drop_hook(self, module):
        """Take the hook off a model that is compiled, or wrapped: a hook of a file outside torch makes
        torch.compile trace a model it would otherwise leave alone (2 graphs where there are 0, for
        torch.compile(DDP(nn.Sequential))), and the check must not change what it sees."""
        handle = self.hooks.get(module)
        if handle:
            handle.remove()
            self.hooks.set(module, None)

    def note_input(self, ddp, args, kwargs):
        """A DDP model's first training forward: where its batch is, and where the model is."""
        import torch

        with Quietly(self):
            if torch.is_grad_enabled() and not self.fed.get(ddp):
                self.fed.set(ddp, True)
                first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
                if first is not None:
                    model = self.placed(next(ddp.module.parameters(), first))
                    self.rec.add("input", device=self.placed(first), model=model, at=where())

    # torch.cuda's functions, as the node's GPUs would answer (CUDA_ANSWERS)

    def set_device(self, device):
        index = self.index(device)
        if index is not None and index >= 0:  # set_device(-1), or a cpu device: nothing, as in torch
            self.chosen = self.ask(index, "set_device")

    @contextlib.contextmanager
    def current(self, device):
        before = self.chosen
        self.set_device(device)
        yield
        self.chosen = before

    def device_count(self):
        """The node's GPUs. Read, like LOCAL_RANK: a GPU index may come from it."""
        if not self.counted:
            self.counted = True
            self.rec.add("read", key="device_count", by="script", at=where(), found=True)
        return len(self.visible())


class StandInProperties(types.SimpleNamespace):
    """torch.cuda.get_device_properties(): what a stand-in GPU says of itself. A property it lacks
    fails naming this class: the stand-in's gap, reported as not checked, never as the script's."""


PROPERTIES = StandInProperties(
    name="check_ddp stand-in GPU (the CPU)", total_memory=80 * 2**30, major=9, minor=0,
    multi_processor_count=132, is_integrated=False,
)  # fmt: skip


class StandInEvent:
    """torch.cuda.Event(enable_timing=True): record() marks the time, elapsed_time() measures."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, external=False):
        self.time = None

    def record(self, stream=None):
        self.time = time.perf_counter()

    def elapsed_time(self, end):
        return (end.time - self.time) * 1000.0

    def synchronize(self):
        pass

    def query(self):
        return True

    def wait(self, stream=None):
        pass


class StandInStream:
    """A CUDA stream: work on the CPU is in order already."""

    def __init__(self, device=None, priority=0, **kwargs):
        self.device = device

    def synchronize(self):
        pass

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        event = event or StandInEvent()
        event.record()
        return event

    def query(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def autocast_on_cpu(torch):
    """torch.autocast("cuda", ...) in bfloat16 on the CPU, the CPU's half precision."""

    class autocast(torch.amp.autocast_mode.autocast):
        def __init__(self, device_type="cuda", dtype=None, enabled=True, cache_enabled=None):
            if device_type == "cuda":
                device_type, dtype = "cpu", torch.bfloat16
            super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    return autocast


def grad_scaler_on_cpu(torch):
    """torch.amp.GradScaler("cuda"), torch.cuda.amp.GradScaler(): a scaler that scales, on the CPU."""

    class GradScaler(torch.amp.GradScaler):
        def __init__(self, device="cuda", *args, **kwargs):
            super().__init__("cpu" if device == "cuda" else device, *args, **kwargs)

    return GradScaler
