"""The calls that name a device: the GPU asked for is recorded, and the CPU used. And what the stand-in
keeps on the script's models, out of what the script makes of them: its copies and pickles, and
torch.compile's graphs."""

from ..watch.evidence import without_hooks
from ..watch.recorder import Quietly
from ..watch.registry import stands_in


@stands_in("torch.Tensor", "__deepcopy__", step=2, label="copy.deepcopy(tensor)")
@stands_in("torch.nn.Parameter", "__deepcopy__", step=2, label="copy.deepcopy(tensor)")
def tensor_deepcopy(original, s, _):
    def tensor_deepcopy(self, memo):
        copy = original(self, memo)
        index = s.tags.get(self)
        return copy if index is None else s.on_gpu(copy, index)  # a copy of a GPU's tensor: on that GPU

    return tensor_deepcopy


@stands_in("torch.Tensor", "to", step=2, label="tensor.to()")
def tensor_to(original, s, _):
    def tensor_to(self, *args, **kwargs):
        index = None
        if "device" in kwargs:
            index = s.index(kwargs["device"])
            if index is not None:
                kwargs["device"] = "cpu"
        elif args and not hasattr(args[0], "is_floating_point"):  # to(device, ...), not to(dtype)/to(tensor)
            index = s.index(args[0])
            if index is not None:
                args = ("cpu", *args[1:])
        elif args and s.tags.get(args[0]) is not None:  # to(other): other's place
            index = s.tags.get(args[0])
        if index is None:
            return original(self, *args, **kwargs)
        s.ask(index, "to")
        moved = original(self, *args, **kwargs)
        if moved is self and s.tags.get(self) != index:
            moved = self.clone()  # onto another device, a copy: as on a GPU
        return s.on_gpu(moved, index)

    return tensor_to


@stands_in("torch.Tensor", "cuda", step=2, label="tensor.cuda()")
def tensor_cuda(original, s, _):
    def tensor_cuda(self, device=None, non_blocking=False, memory_format=None):
        index = s.ask(s.gpu if device is None else s.index(device), "cuda")
        if s.tags.get(self) == index:
            return self
        return s.on_gpu(self.clone(), index)

    return tensor_cuda


@stands_in("torch.Tensor", "pin_memory", "record_stream", step=2, label="tensor.{name}()")
def tensor_itself(original, s, _):
    def tensor_itself(self, *args, **kwargs):
        return self  # page-locked memory and streams are a GPU's; on the CPU, nothing to do

    return tensor_itself


@stands_in("torch.nn.Module", "to", "cuda", step=2, label="model.{name}()")
def module_to(original, s, name):
    import torch

    def module_to(self, *args, **kwargs):
        if name == "cuda":
            device = args[0] if args else kwargs.get("device")
            index = s.ask(s.gpu if device is None else s.index(device), "model.cuda")
            result = self
        else:
            if "device" in kwargs and s.index(kwargs["device"]) is not None:  # to(device=0): cuda:0
                index, kwargs = s.index(kwargs["device"]), {**kwargs, "device": "cpu"}
            elif args and not hasattr(args[0], "is_floating_point") and s.index(args[0]) is not None:
                index, args = s.index(args[0]), ("cpu", *args[1:])
            else:
                return original(self, *args, **kwargs)
            device, dtype, non_blocking, memory_format = torch._C._nn._parse_to(*args, **kwargs)
            s.ask(index, "model.to")
            rest = {"dtype": dtype} if dtype is not None else {}
            rest.update({"memory_format": memory_format} if memory_format is not None else {})
            result = original(self, "cpu", non_blocking=non_blocking, **rest)
        for tensor in (*self.parameters(), *self.buffers()):
            s.on_gpu(tensor, index)
        s.wait_for_first_batch(self)
        return result

    return module_to


# the functions that take a device= (torch.utils._device's list, and their *_like and new_* kin)
FACTORIES = (
    "empty", "empty_permuted", "empty_strided", "ones", "zeros", "full", "arange", "range", "linspace",
    "logspace", "eye", "rand", "randn", "randint", "randperm", "tensor", "as_tensor", "asarray",
    "scalar_tensor", "empty_like", "zeros_like", "ones_like", "full_like", "rand_like", "randn_like",
    "randint_like", "tril_indices", "triu_indices", "sparse_coo_tensor",
)  # fmt: skip


@stands_in("torch", *FACTORIES, step=2, label="torch.{name}(..., device=)")
@stands_in(
    "torch.Tensor", "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", step=2,
    label="tensor.{name}(..., device=)",
)  # fmt: skip
def factory(original, s, name):
    def factory(*args, **kwargs):
        index = s.index(kwargs.get("device"))
        if index is None:
            return original(*args, **kwargs)
        s.ask(index, name)
        return s.on_gpu(original(*args, **{**kwargs, "device": "cpu"}), index)

    return factory


@stands_in("torch", "set_default_device", step=2, label="torch.set_default_device()")
def set_default_device(original, s, _):
    def set_default_device(device):
        index = s.index(device)
        if index is not None:
            s.ask(index, "set_default_device")
            device = "cpu"
        return original(device)

    return set_default_device


@stands_in("torch", "load", step=6, label="torch.load()")
def load_on_cpu(original, s, _):
    def load_on_cpu(f, map_location=None, *args, **kwargs):
        return original(f, "cpu", *args, **kwargs)  # whatever it names, a GPU's tensors land on the CPU

    return load_on_cpu


@stands_in("torch.nn.Module", "__getstate__", step=4, label="copy.deepcopy(model)")
def module_getstate_standin(original, s, _):
    def module_getstate(self):
        handle = s.hooks.get(self)
        return without_hooks(original(self), [handle] if handle else [])

    return module_getstate


@stands_in("torch", "compile", step=4, label="torch.compile()")
@stands_in("torch.nn.Module", "compile", step=4, label="Module.compile()")
def compile_standin(original, s, name):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    def compile_standin(*args, **kwargs):
        target = args[0] if args else kwargs.get("model")
        with Quietly(s):
            if isinstance(target, torch.nn.Module):
                s.drop_hook(target.module if isinstance(target, DistributedDataParallel) else target)
        return original(*args, **kwargs)

    return compile_standin
