"""The stand-in's torch.cuda: its functions as the node's GPUs answer them, the legacy GPU tensor types,
autocast and GradScaler on the CPU; and what of torch.cuda is left to torch, each with why."""

import collections
import contextlib
import functools

from ..watch.frames import callers_frame, in_torch
from ..watch.registry import replaces, stands_in
from .node import PROPERTIES, StandIn, StandInEvent, StandInStream


def nothing(s, *args, **kwargs):
    return None


def zero(s, *args, **kwargs):
    return 0


# torch.cuda's functions as the node's GPUs answer them: each called with the stand-in first
CUDA_ANSWERS = {
    "is_available": lambda s: True,
    "is_initialized": lambda s: True,
    "device_count": StandIn.device_count,
    "current_device": lambda s: s.shown(s.gpu),
    "set_device": StandIn.set_device,
    "device": StandIn.current,
    "Event": lambda s, *args, **kwargs: StandInEvent(*args, **kwargs),
    "Stream": lambda s, *args, **kwargs: StandInStream(*args, **kwargs),
    "current_stream": lambda s, device=None: StandInStream(device),
    "default_stream": lambda s, device=None: StandInStream(device),
    "stream": lambda s, stream=None: contextlib.nullcontext(),
    "get_device_name": lambda s, device=None: PROPERTIES.name,
    "get_device_properties": lambda s, device=None: PROPERTIES,
    "get_device_capability": lambda s, device=None: (PROPERTIES.major, PROPERTIES.minor),
    "is_bf16_supported": lambda s, *args, **kwargs: True,
    "mem_get_info": lambda s, device=None: (PROPERTIES.total_memory, PROPERTIES.total_memory),
    "memory_summary": lambda s, *args, **kwargs: "check_ddp: a stand-in GPU has no memory of its own",
    "memory_stats": lambda s, *args, **kwargs: collections.defaultdict(int),
    # a GPU's own random generator: torch.compile saves and restores it around its tracing
    "get_rng_state": lambda s, *args, **kwargs: s.rng_state.clone(),
    "get_rng_state_all": lambda s, *args, **kwargs: [s.rng_state.clone()] * len(s.visible()),
    "initial_seed": lambda s: 0,
    "memory_snapshot": lambda s, *args, **kwargs: [],
    **dict.fromkeys(
        ("memory_stats_as_nested_dict", "host_memory_stats", "host_memory_stats_as_nested_dict"),
        lambda s, *args, **kwargs: {},
    ),
    "list_gpu_processes": lambda s, device=None: "check_ddp: a stand-in GPU runs no process of its own",
    "get_per_process_memory_fraction": lambda s, device=None: 1.0,
    "get_arch_list": lambda s: [f"sm_{PROPERTIES.major}{PROPERTIES.minor}"],
    "get_gencode_flags": lambda s: f"-gencode compute=compute_{PROPERTIES.major}{PROPERTIES.minor}",
    "is_tf32_supported": lambda s: True,
    "can_device_access_peer": lambda s, device, peer: True,
    "get_sync_debug_mode": zero,
    "is_current_stream_capturing": lambda s: False,
    "get_allocator_backend": lambda s: "native",
    "get_stream_from_external": lambda s, *args, **kwargs: StandInStream(),
    "device_of": lambda s, obj: contextlib.nullcontext(),
    **dict.fromkeys(
        (
            "utilization", "memory_allocated", "max_memory_allocated", "memory_reserved",
            "max_memory_reserved", "memory_cached", "max_memory_cached", "device_memory_used", "memory_usage",
            "power_draw", "temperature", "clock_rate", "current_blas_handle", "current_solver_handle",
        ),
        zero,
    ),
    **dict.fromkeys(
        (
            "synchronize", "init", "empty_cache", "reset_peak_memory_stats", "reset_max_memory_allocated",
            "seed", "seed_all", "reset_accumulated_memory_stats", "manual_seed", "manual_seed_all",
            "set_per_process_memory_fraction", "ipc_collect", "set_sync_debug_mode", "set_rng_state",
            "set_rng_state_all", "reset_max_memory_cached", "reset_accumulated_host_memory_stats",
            "reset_peak_host_memory_stats", "set_stream",
        ),
        nothing,
    ),
}  # fmt: skip


# torch.cuda's modules whose functions are torch.cuda's own under a second name (torch.cuda.memory.
# memory_allocated is torch.cuda.memory_allocated): each answered alike
MEMORY = (
    "empty_cache", "memory_stats", "memory_stats_as_nested_dict", "reset_accumulated_memory_stats",
    "reset_peak_memory_stats", "reset_max_memory_allocated", "reset_max_memory_cached", "host_memory_stats",
    "host_memory_stats_as_nested_dict", "reset_accumulated_host_memory_stats", "reset_peak_host_memory_stats",
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved", "memory_cached",
    "max_memory_cached", "memory_snapshot", "memory_summary", "list_gpu_processes", "mem_get_info",
    "get_allocator_backend", "get_per_process_memory_fraction", "set_per_process_memory_fraction",
)  # fmt: skip


RANDOM = (
    "get_rng_state", "get_rng_state_all", "set_rng_state", "set_rng_state_all", "manual_seed",
    "manual_seed_all", "seed", "seed_all", "initial_seed",
)  # fmt: skip


# The rest of torch.cuda's public names (torch.cuda.__all__), left to torch, each with why: a job that
# calls one fails as torch fails without CUDA, and that is reported as needing a GPU (--), never as the
# script's mistake. The tests hold every public name of torch.cuda to one of the tables.
CUDA_LEFT = {
    **dict.fromkeys(
        ("CUDAGraph", "graph", "graphs", "make_graphed_callables", "graph_pool_handle"),
        "CUDA graphs replay GPU kernels recorded on a GPU: nothing the CPU can stand in for",
    ),
    **dict.fromkeys(
        (
            "MemPool", "use_mem_pool", "CUDAPluggableAllocator", "change_current_allocator",
            "caching_allocator_alloc", "caching_allocator_delete", "caching_allocator_disabled",
            "caching_allocator_enable", "GreenContext",
        ),
        "the GPU's own memory and multiprocessors, managed by hand",
    ),
    **dict.fromkeys(
        ("jiterator", "nccl", "cudart", "check_error", "cudaStatus", "tunable", "sparse", "streams"),
        "CUDA's own libraries and kernels, called directly",
    ),
    **dict.fromkeys(("CudaError", "DeferredCudaCallError"), "torch's errors, raised by torch itself"),
    **dict.fromkeys(
        ("ExternalStream", "StreamContext"),
        "classes torch's own code tests against (torch.compile's isinstance): a function in their place "
        "breaks it",
    ),
    **dict.fromkeys(("has_half", "has_magma"), "this build's flags, true or false as torch has them"),
    **dict.fromkeys(
        (f"{kind}Storage" for kind in ("BFloat16", "Bool", "Byte", "Char", "ComplexDouble", "ComplexFloat",
                                       "Double", "Float", "Half", "Int", "Long", "Short")),
        "typed storages, deprecated by torch: a script reaches its tensors' storage through the tensors",
    ),
    **dict.fromkeys(("amp", "nvtx", "memory", "random", "profiler"), "a module whose functions are stood in"),
}  # fmt: skip


@replaces("torch.cuda", *CUDA_ANSWERS)
@replaces("torch.cuda.memory", *MEMORY)
@replaces("torch.cuda.random", *RANDOM)
def cuda_answer(original, s, name):
    """torch.cuda's function as the script sees it, stood in, and as torch's own code sees it, real:
    torch.compile, the DataLoader and the rest of torch ask about CUDA to decide what to run, and
    what they run is the CPU's. A function object of its own for each name: torch.compile keeps a
    rule per torch function, and refuses one object under two names."""
    stood_in = functools.partial(CUDA_ANSWERS[name], s)

    @functools.wraps(original)
    def answer(*args, **kwargs):
        frame = callers_frame()
        if frame is not None and in_torch(frame.f_code):
            return original(*args, **kwargs)
        return stood_in(*args, **kwargs)

    return answer


@replaces("torch.cuda.nvtx", "range_push", "range_pop", "range_start", "range_end", "mark", "range")
@replaces("torch.cuda.profiler", "start", "stop", "profile")
def nvtx(original, s, name):
    """NVIDIA's profiler and its marks: nothing to mark or profile on the CPU."""
    if name in ("range", "profile"):
        return lambda *args, **kwargs: contextlib.nullcontext()
    return lambda *args, **kwargs: 0


@replaces("torch.cuda", "default_generators")
def cuda_generators(original, s, _):
    """Each GPU's default random generator: one of its own, as a GPU's is, so that seeding one leaves the
    CPU's as it was."""
    import torch

    return tuple(torch.Generator() for _ in range(s.node_gpus))


# torch's legacy tensor types of the GPU (torch.cuda.FloatTensor(2, 3), x.type(torch.cuda.LongTensor),
# isinstance(x, torch.cuda.FloatTensor)), as older scripts use them: the CPU's, put on the current GPU
LEGACY_TYPES = ("BFloat16", "Bool", "Byte", "Char", "Double", "Float", "Half", "Int", "Long", "Short")


@replaces("torch.cuda", *(f"{kind}Tensor" for kind in LEGACY_TYPES))
def legacy_type(original, s, name):
    import torch

    cpu = getattr(torch, name)  # torch.FloatTensor: the CPU's legacy type, of the same dtype

    class LegacyGPUType(type):
        def __instancecheck__(cls, thing):
            return isinstance(thing, cpu) and s.tags.get(thing) is not None

    def __new__(cls, *args, **kwargs):
        return s.on_gpu(cpu(*args, **kwargs), s.ask(s.gpu, "legacy type"))

    made = {
        "__new__": __new__,
        "dtype": cpu.dtype,
        "is_cuda": True,
        "__module__": "torch.cuda",
        "__qualname__": name,
    }
    return LegacyGPUType(name, (), made)


@stands_in("torch.Tensor", "type", step=2, label="tensor.type()")
def tensor_type(original, s, _):
    def tensor_type(self, dtype=None, non_blocking=False, **kwargs):
        wanted = getattr(dtype, "__name__", None) if isinstance(dtype, type) else dtype
        if isinstance(wanted, str) and (wanted.startswith("torch.cuda.") or getattr(dtype, "is_cuda", False)):
            kind = wanted.rpartition(".")[2]
            moved = original(self, f"torch.{kind}", non_blocking, **kwargs)
            return s.on_gpu(moved if moved is not self else self.clone(), s.ask(s.gpu, "type"))
        if dtype is None and s.tags.get(self) is not None:  # x.type(): as a GPU's tensor names itself
            return original(self).replace("torch.", "torch.cuda.", 1)
        return original(self, dtype, non_blocking, **kwargs) if dtype is not None else original(self)

    return tensor_type


@replaces("torch", "autocast")
@replaces("torch.amp", "autocast", "GradScaler")
@replaces("torch.amp.autocast_mode", "autocast")
@replaces("torch.amp.grad_scaler", "GradScaler")
def amp_on_cpu(original, s, name):
    """One autocast and one GradScaler of the CPU's, under each name torch gives them."""
    return s.autocast if name == "autocast" else s.scaler


@replaces("torch.cuda.amp", "autocast", "GradScaler")
def cuda_amp_on_cpu(original, s, name):
    """torch.cuda.amp's classes: torch.amp's, for the device "cuda"."""
    base = s.autocast if name == "autocast" else s.scaler

    def __init__(self, *args, **kwargs):
        base.__init__(self, "cuda", *args, **kwargs)

    return type(name, (base,), {"__init__": __init__})


@replaces("torch.nn.SyncBatchNorm", "forward")
@replaces("torch.nn.modules", "SyncBatchNorm")
def sync_batchnorm_as_batchnorm(original, s, name):
    """SyncBatchNorm, which shares its batch statistics between GPUs, computes them on the CPU as
    BatchNorm does, on the rank's own batch; DDP accepts it (its check that SyncBatchNorm is on GPUs
    reads torch.nn.modules.SyncBatchNorm, which no layer is then)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    return _BatchNorm.forward if name == "forward" else type("SyncBatchNormOnGPUs", (), {})


@replaces("torch.nn.parallel.data_parallel", "_get_available_device_type")
def data_parallel_on_cpu(original, s, _):
    """DataParallel (one process, several GPUs) finds no GPU type, and passes its inputs through, as
    torch's own CPU path does."""
    return lambda: None
