"""What the watcher reads of the script's objects without calling anything of the script's: data
fingerprinted, a dataset's length as stored, a checkpoint's contents, a tensor's local shard."""

import inspect
import os


def fingerprint(value, depth=0):
    """A short summary of data, equal on two ranks exactly when the data is (tensors, arrays,
    numbers, strings, and lists, tuples and dicts of them). It calls nothing of the script's: any
    other object is summed up by its type's name."""
    import hashlib

    import torch

    if isinstance(value, torch.Tensor):
        flat = value.detach().reshape(-1)
        step = max(1, flat.numel() // 65536)
        sample = flat[::step].cpu().contiguous()
        return f"{tuple(value.shape)}:{hashlib.blake2b(sample.numpy().tobytes(), digest_size=8).hexdigest()}"
    if type(value).__module__ == "numpy" and type(value).__name__ == "ndarray":
        return fingerprint(torch.as_tensor(value), depth)
    if type(value) in (list, tuple) and depth < 3:
        return "[" + ",".join(fingerprint(v, depth + 1) for v in value[:16]) + "]"
    if type(value) is dict and depth < 3:
        return "{" + ",".join(f"{k!r}={fingerprint(v, depth + 1)}" for k, v in list(value.items())[:16]) + "}"
    if type(value) in (int, float, bool, str, bytes, type(None)) or type(value).__module__ == "numpy":
        return repr(value)[:64]
    return type(value).__name__


def attribute(thing, name):
    """thing.name as it is stored, or None: without calling anything of the script's (no property,
    no __getattr__), as a debugger reads an object."""
    try:
        value = inspect.getattr_static(thing, name)
    except AttributeError:
        return None
    return None if hasattr(type(value), "__get__") and not callable(value) else value


def path_of(file):
    """The path a torch.save or torch.load goes to: a path, or an open file's name (io's own
    attribute); None for a buffer in memory, or an object of the script's (nothing of it is called)."""
    import io

    path = file if isinstance(file, (str, os.PathLike)) else None
    if isinstance(file, io.IOBase):
        path = getattr(file, "name", None)
    return path if isinstance(path, (str, os.PathLike)) else None


def is_torchs(thing):
    """An object of torch's own classes (a sampler, a dataset wrapper): its methods are torch's."""
    return type(thing).__module__.startswith("torch.")


def stored_data(dataset, depth=0):
    """The data a dataset holds in its attributes (tensors, arrays, lists of them, of numbers or of
    strings), read as stored."""
    import torch

    def is_data(value, depth):
        if isinstance(value, torch.Tensor) or type(value).__name__ == "ndarray":
            return True
        if type(value) in (list, tuple) and value and depth < 2:
            return is_data(value[0], depth + 1)
        if type(value) is dict and value and depth < 2:  # a sample as a dict: {"image": path, "label": path}
            return is_data(next(iter(value.values())), depth + 1)
        return depth > 0 and type(value) in (int, float, str)

    try:
        held = object.__getattribute__(dataset, "__dict__")  # as stored: no __getattr__ of the script's
    except AttributeError:
        return []
    return [v for v in dict(held).values() if is_data(v, 0)]


def stored_length(dataset):
    """The number of samples a dataset holds, read from the data it stores (its tensors' and arrays'
    first dimension, its lists' lengths) where they all agree; None where it stores none, or they differ."""
    lengths = {
        len(value) if type(value) in (list, tuple) else value.shape[0] for value in stored_data(dataset)
    }
    lengths.discard(0)
    return lengths.pop() if len(lengths) == 1 else None


def dataset_fingerprint(dataset):
    """The data a dataset holds (its tensors, arrays and lists), read as stored: None for a dataset
    that makes its samples as they are asked for. The check calls nothing of the dataset's: a
    __getitem__ may draw from a generator of the script's, or count, or cache."""
    import torch

    if (
        type(dataset) in (list, tuple)
        or isinstance(dataset, torch.Tensor)
        or type(dataset).__name__ == "ndarray"
    ):
        return fingerprint(dataset)  # a DataLoader over a list of samples (of ids, of file names): the data
    stored = stored_data(dataset)
    return fingerprint(stored) if stored else None


def describe_checkpoint(obj):
    """What a saved object holds: model state dicts (and their key prefixes), optimizer state."""
    import torch

    found = {"models": 0, "module_prefix": 0, "orig_mod_prefix": 0, "optimizer": False, "module": None}
    found["sharded"] = 0  # DTensors: a sharded model's state, this rank's shards of it

    def visit(value, depth):
        if isinstance(value, torch.nn.Module):
            found["module"] = type(value).__name__
        elif isinstance(value, dict) and depth < 5:
            keys = list(value)
            if {"state", "param_groups"} <= set(keys):
                found["optimizer"] = True
            elif (
                keys
                and all(isinstance(k, str) for k in keys)
                and all(isinstance(v, torch.Tensor) for v in value.values())
            ):
                found["models"] += 1
                found["sharded"] += sum(type(v).__name__ == "DTensor" for v in value.values())
                found["module_prefix"] += all(k.startswith("module.") for k in keys)
                found["orig_mod_prefix"] += any("_orig_mod." in k for k in keys)
            else:
                for v in value.values():
                    visit(v, depth + 1)
        elif isinstance(value, (list, tuple)) and depth < 5:
            for v in value:
                visit(v, depth + 1)

    visit(obj, 0)
    return found


def length_of(thing):
    try:
        return len(thing)
    except Exception:  # noqa: BLE001 (a length torch cannot give: none is recorded)
        return None


def grad_enabled():
    import torch

    return torch.is_grad_enabled()


def input_sum(tensor):
    """A batch summed up, to compare between ranks and steps: up to 1,024 of its values, weighted
    by their place, kept on the batch's device until the process ends (no sync with a GPU)."""
    import torch

    flat = tensor.detach().reshape(-1)
    sample = flat[:: max(1, flat.numel() // 1024)][:1024].double()
    return (sample * torch.arange(1, len(sample) + 1, device=sample.device)).sum()


def without_hooks(state, handles):
    """A model's state (Module.__getstate__), without the forward pre-hooks of these handles."""
    if handles:
        ours = {handle.id for handle in handles}
        state = dict(state)
        for name in ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs"):
            if isinstance(state.get(name), dict):
                state[name] = type(state[name])((k, v) for k, v in state[name].items() if k not in ours)
    return state


def refused_on_load(path, obj):
    """(the globals torch.load(weights_only=True) refuses in the file just saved at path, where in obj
    the first value of such a type is), or (None, None) where it cannot be read back (a buffer in
    memory, the legacy format). torch reads only the file's pickle, and calls nothing in it."""
    import torch

    try:
        unsafe = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path)) if path else None
    except Exception:  # noqa: BLE001 (not a zip checkpoint: not known)
        return None, None
    return unsafe, (first_of_type(obj, unsafe) if unsafe else None)


def first_of_type(value, names, at="", depth=0):
    """Where in a saved object the first value is whose type is one of names (module.Name, as torch's
    refusal names them), or of numpy's where one of them is numpy's: "['args']: argparse.Namespace";
    None if none is. Read as stored: no method of the script's objects is called."""
    import torch

    kind = type(value)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if name in names or (kind.__module__ == "numpy" and any(n.startswith("numpy") for n in names)):
        return f"{at or 'the object'}: {name}"
    if depth > 4 or isinstance(value, torch.Tensor):
        return None
    if isinstance(value, dict):
        items = list(dict.items(value))[:256]  # dict's own: no items() of a subclass of the script's
    elif type(value) in (list, tuple):
        items = list(enumerate(value))[:256]
    else:
        return None
    for key, item in items:
        found = first_of_type(item, names, f"{at}[{key!r}]", depth + 1)
        if found:
            return found
    return None


def shared_folder(path):
    """Whether the folder of path is one any user of the machine may write to (/tmp, /dev/shm): a file
    there could have been put or replaced by another process than the job's."""
    import stat

    try:
        return bool(os.stat(os.path.dirname(os.path.abspath(path))).st_mode & stat.S_IWOTH)
    except OSError:
        return None


def dist_initialized():
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def ends(message):
    """A long error message's beginning and end: a child's traceback ends with its own error."""
    return message if len(message) <= 1200 else f"{message[:400]}\n...\n{message[-800:]}"


def local(tensor):
    """A tensor's values on this rank, detached: a DTensor's local shard (its to_local(), a view, no
    collective), else the tensor itself. The watcher never gathers a sharded model's parameters."""
    to_local = getattr(type(tensor), "to_local", None)
    return (to_local(tensor) if to_local is not None else tensor).detach()


def local_sum(module):
    """The sum of a model's parameters as this rank holds them (its local shards, for a sharded model)."""
    import torch

    with torch.no_grad():
        return sum(float(local(p).double().sum()) for p in module.parameters())


def is_empty(path):
    try:
        return os.path.isfile(path) and os.path.getsize(path) == 0
    except OSError:
        return False


def weights_summary(weights):
    """The replica's weights summed up, to compare between ranks: their sum, their squares' sum, their
    count ({} where there are none). A DTensor counts as its local shard."""
    import torch

    if not weights:
        return {}
    with torch.no_grad():
        flat = [local(p).double().reshape(-1) for p in weights]
        return {
            "sum": sum(float(p.sum()) for p in flat),
            "squares": sum(float((p * p).sum()) for p in flat),
            "count": sum(p.numel() for p in flat),
        }
