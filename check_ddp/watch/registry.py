"""The wrappers, declared: each call watched (or stood in for) is a Wrapper in WRAPPERS, with the step
it belongs to and the label a report names it by (CALLS); the private names of torch's the watcher
relies on (PRIVATE), looked up so that a torch that renames one fails loudly. Each wrapper's make()
returns the function that stands in for the original; apply() puts it in place."""

import functools
import importlib.util
import json
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Call:
    """A call the watcher wraps: the step it belongs to, and how a report names it."""

    step: int
    label: str


@dataclass(frozen=True)
class Wrapper:
    owner: str  # a module or a class, by its dotted name: resolved in the job's process
    name: str  # the attribute wrapped
    key: str  # the CALLS key: what a record names the call by
    make: object  # make(original, watcher, name) -> the function put in its place
    compiled_through: bool  # torch.compile must not trace the wrapper, only what it wraps
    standin: bool  # part of the stand-in for CUDA and NCCL: applied only on the CPU, inside the others
    as_is: bool = False  # the stand-in's: put in place as make() returns it, not a call it wraps


WRAPPERS = []  # in the order watch() applies them


CALLS = {}  # key: Call


CALL_OF_CODE = {}  # each applied wrapper's code object: its CALLS key (to tell a frame's call)


def watches(owner, *names, step, label, compiled_through=False, standin=False):
    """Declare a wrapper of owner.name, for each name: `label` may hold {name}. A stand-in's wrapper
    (standin=True) is applied first, so that the watcher's wrapper of the same call sees what the
    script passed, and the stand-in what the CPU can run."""

    def register(make):
        for name in names:
            key = f"{owner}.{name}"
            CALLS.setdefault(key, Call(step, label.format(name=name)))
            WRAPPERS.append(Wrapper(owner, name, key, make, compiled_through, standin))
        return make

    return register


# torch's private names that the watcher and the stand-in rely on, beyond the calls they wrap: a
# module's or class's attribute ("torch.jit._builtins._get_builtin_table"), an instance's, on an
# instance made from nothing ("torch.nn.Module()._forward_pre_hooks"), or one its class's __init__ sets
# on each instance ("torch.nn.parallel.DistributedDataParallel#require_backward_grad_sync": public in
# name, not in torch's documentation, as STYLE.md has it). Each is looked up when a job
# starts (one missing is the check's fault: it says it is incomplete) and by the quick tier of the
# tests, so that a torch that renames one fails loudly, with its name, and never silences a rule.
PRIVATE = (
    "torch.jit._builtins._get_builtin_table",
    "torch._C._nn._parse_to",
    "torch.nn.modules.batchnorm._BatchNorm.forward",
    "torch.optim.optimizer.register_optimizer_step_post_hook",
    "torch.nn.Module._compiled_call_impl",
    "torch.nn.Module()._forward_pre_hooks",
    "torch.nn.Module()._forward_pre_hooks_with_kwargs",
    "torch.utils.data.DataLoader([0])._dataset_kind",
    "torch._dynamo.utils.counters",
    "multiprocessing.process.BaseProcess()._target",
    "multiprocessing.process.BaseProcess()._popen",
    "argparse.ArgumentParser()._actions",
    "torch.utils.data.dataloader._BaseDataLoaderIter#_dataset_kind",
    "torch.nn.parallel.DistributedDataParallel#require_backward_grad_sync",
    "torch.nn.parallel.DistributedDataParallel.will_sync_module_buffers",
    "torch._dynamo.eval_frame.OptimizedModule#_orig_mod",
    "torch.distributed.fsdp.FullyShardedDataParallel#_fsdp_wrapped_module",
)


def missing_names(imported_only=False):
    """The names the watcher relies on that this torch (and Python) lacks: every call it wraps, and
    PRIVATE's (imported_only: only those of modules imported already: torch._dynamo takes seconds,
    and is read only if the script imported it). Empty when all are there."""
    missing = []
    for wrapper in WRAPPERS:
        try:
            if not hasattr(resolve(wrapper.owner), wrapper.name):
                missing.append(wrapper.key)
        except (ImportError, AttributeError):
            missing.append(wrapper.key)
    for name in PRIVATE:
        owner, _, attr = name.rpartition("#") if "#" in name else name.rpartition(".")
        if imported_only and owner.split("(")[0].rpartition(".")[0] not in sys.modules:
            continue
        try:
            if "#" in name:  # set by the class's __init__ on each instance: its code names it
                if attr not in resolve(owner).__init__.__code__.co_names:
                    missing.append(name)
                continue
            if owner.endswith(")"):  # an instance's, made from nothing
                made, _, given = owner[:-1].partition("(")
                thing = resolve(made)(*([json.loads(given)] if given else []))
            else:
                thing = resolve(owner)
            if not hasattr(thing, attr):
                missing.append(name)
        except (ImportError, AttributeError, TypeError):
            missing.append(name)
    return missing


def resolve(dotted):
    """A module or a class by its dotted name: torch.distributed, torch.utils.data.DataLoader."""
    try:
        return importlib.import_module(dotted)
    except ImportError:
        module, _, name = dotted.rpartition(".")
        return getattr(importlib.import_module(module), name)


def apply(wrapper, by, replaced):
    """Put a wrapper in place (of the watcher's, or of the stand-in's: `by`, which make() is given)."""
    owner = resolve(wrapper.owner)
    original = getattr(owner, wrapper.name, None)
    if original is None:  # this torch has no such call: never skipped in silence (missing_names)
        return
    function = wrapper.make(original, by, wrapper.name)
    if not wrapper.as_is:
        function = functools.wraps(original)(function)
        # a code object of its own, so that a frame of it names its call (wrappers share their code)
        function.__code__ = function.__code__.replace(co_name=f"{function.__code__.co_name}_{wrapper.name}")
        CALL_OF_CODE[function.__code__] = wrapper.key
    if wrapper.compiled_through:
        import torch

        function = torch.compiler.disable(function, recursive=False)
    setattr(owner, wrapper.name, function)
    replaced.append((original, function))


def keep_torchscript_builtins(replaced):
    """TorchScript knows torch's own functions (torch.zeros is aten::zeros) by what they are; a wrapper
    of one would be compiled as Python, from a source it cannot find. Each wrapper of such a function
    is the same builtin to it."""
    from torch.jit import _builtins

    table = _builtins._get_builtin_table()
    for original, wrapper in replaced:
        if id(original) in table:
            table[id(wrapper)] = table[id(original)]


def stands_in(owner, *names, step, label, compiled_through=False):
    """Declare a wrapper of the stand-in's: make(original, stand_in, name), applied before the watcher's."""
    return watches(owner, *names, step=step, label=label, compiled_through=compiled_through, standin=True)


def replaces(owner, *names):
    """Declare what the stand-in puts in place of owner.name, for each name: make(original, stand_in,
    name) returns it, as it is (a class, a constant answer: not a call the records name)."""

    def register(make):
        for name in names:
            WRAPPERS.append(Wrapper(owner, name, f"{owner}.{name}", make, False, True, as_is=True))
        return make

    return register
