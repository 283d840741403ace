"""DDP step 4: the wrapper (DDP, or a model sharded by FSDP), what goes through it, its backward passes
and optimizer steps, torch.compile, and the replicas' weights."""

import functools
import inspect
import time
import weakref

from .evidence import grad_enabled, input_sum, local, local_sum, without_hooks
from .files import observe_writes
from .frames import called_by_user, where, within
from .recorder import Quietly
from .registry import watches


def ddp_freed(rec, _):
    """The DDP model is being freed, training done: on disk now, and a moment for gloo. In torch
    2.13 freeing it joins gloo's threads while holding the GIL, and a thread still releasing a
    tensor of the last collective needs the GIL: the process hangs (pytorch/pytorch#190489). The
    pause lets that thread finish first; this watcher's own thread makes the race likelier."""
    rec.add("ddp_freed")
    time.sleep(0.1)


@watches("torch.nn.parallel.DistributedDataParallel", "__init__", step=4, label="DDP(...)")
def ddp_init(original, w, _):
    import weakref

    signature = inspect.signature(original)

    def ddp_init(self, module, *args, **kwargs):
        asked = None
        with Quietly(w):
            asked = signature.bind_partial(self, module, *args, **kwargs).arguments.get("device_ids")
        original(self, module, *args, **kwargs)
        with Quietly(w):
            w.live_ddp.append(weakref.ref(self, functools.partial(ddp_freed, w.rec)))
            drop_hooks(w, module)  # one hook a model, however many times it is wrapped
            if getattr(self.module, "_compiled_call_impl", None) is None:  # see drop_hooks
                hook(w, self.module, functools.partial(bare_forward, w))
            w.weights.extend(self.module.parameters())
            inner = getattr(module, "_orig_mod", module)
            w.rec.add(
                "ddp",
                at=where(),
                module=type(inner).__name__,
                compiled=getattr(module, "_compiled_call_impl", None) is not None,
                compiled_inside=hasattr(module, "_orig_mod"),
                device_ids=[str(d) for d in (asked or [])],
                find_unused_parameters=self.find_unused_parameters,
                devices=sorted({str(p.device) for p in self.module.parameters()}),
                parameters=sum(p.numel() for p in self.module.parameters()),
            )

    return ddp_init


@watches(
    "torch.nn.parallel.DistributedDataParallel", "forward", step=4, label="DDP forward", compiled_through=True
)
def ddp_forward(original, w, _):
    def ddp_forward(self, *args, **kwargs):
        w.note_forward(self, args, kwargs)
        w.state["in_ddp"] = True
        try:
            return original(self, *args, **kwargs)
        finally:
            w.state["in_ddp"] = False

    return ddp_forward


def note_forward(w, ddp, args, kwargs):
    """What a forward through the DDP model tells: an evaluation, or a training forward (its input,
    and whether DDP prepared its backward's all-reduce). Out of torch.compile's sight (watch() makes
    it so): none of what it computes may become part of a graph of the script's."""
    import torch

    with Quietly(w):
        observe_writes(w)
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if not torch.is_grad_enabled():  # a forward without gradients: evaluation, or inference
            # through DDP, a collective where DDP syncs the model's buffers (BatchNorm's) from rank 0
            evaluated(w, first, through="ddp" if ddp.will_sync_module_buffers() else None)
            return
        w.state["forward"] += 1
        # DDP prepares the all-reduce of the coming backward here, at forward time, or not
        w.state["last"] = bool(ddp.require_backward_grad_sync)
        w.state["prepared"] += w.state["last"]
        if first is not None and first.numel():
            w.inputs.append(input_sum(first))


def evaluated(w, first=None, through=None):
    """A forward without gradients, through the DDP model or the model it wraps: the first of a
    run of them (an evaluation, if no optimizer step comes in between) is recorded, with its line;
    what each evaluated is summed up (its first input), to compare between ranks."""
    import torch

    w.state["evaluations"] += 1
    if isinstance(first, torch.Tensor) and first.numel() and len(w.eval_inputs) < 256:
        w.eval_inputs.append(input_sum(first))
    if not w.state["evaluating"]:
        w.state["evaluating"] = True
        extra = {"through": through} if through else {}
        w.rec.add("eval", at=where(), loader=w.state["pass"] and w.state["pass"]["loader"], **extra)


def hook(w, module, function):
    """A forward pre-hook of the watcher's on one of the script's models, kept beside the model. Its
    copies and pickles never carry it (Module.__getstate__, wrapped below, leaves it out)."""
    handle = module.register_forward_pre_hook(function)
    w.of.set(module, w.of.get(module) or {"hooks": []})["hooks"].append(handle)


def drop_hooks(w, module):
    """Take this watcher's forward hooks off a model that is compiled, or wrapped: a hook of a file
    outside torch makes torch.compile trace a model it would otherwise leave alone (2 graphs where
    there are 0, for torch.compile(DDP(nn.Sequential))), and the check must not change what it sees."""
    info = w.of.get(module)
    for handle in info["hooks"] if info else ():
        handle.remove()
    if info:
        info["hooks"] = []


def bare_forward(w, module, args):
    """A forward hook on the model DDP wraps: an evaluation through model.module."""
    import torch

    with Quietly(w):
        if not grad_enabled() and not w.state["in_ddp"]:
            evaluated(w, next((a for a in args if isinstance(a, torch.Tensor)), None))


@watches("torch.nn.Module", "__getstate__", step=4, label="copy.deepcopy(model)")
def module_getstate(original, w, _):
    """A model copied (copy.deepcopy, for an EMA model) or pickled (torch.save(model)) is copied as
    the script made it: without the watcher's hooks, which stay on the original alone."""

    def module_getstate(self):
        info = w.of.get(self)
        return without_hooks(original(self), info["hooks"] if info else [])

    return module_getstate


@watches("torch.autograd", "backward", step=4, label="backward()")
def autograd_backward(original, w, _):
    def autograd_backward(*args, **kwargs):
        with Quietly(w):
            w.state["backward"] += 1
            w.state["synced"] += any(m.require_backward_grad_sync for m in w.models())
            if w.state["pass"] is not None:
                w.state["pass"]["backward"] += 1
        return original(*args, **kwargs)

    return autograd_backward


def after_step(w, optimizer, args, kwargs):
    """Every optimizer step (torch's post-step hook): what happened since the last. Not the step of
    no gradients DCP's state-dict API takes to make an optimizer's state (_init_optim_state)."""
    if within("distributed/checkpoint"):
        return
    state = w.state
    with Quietly(w):
        observe_writes(w)
        if not w.weights:
            w.weights.extend(p for group in optimizer.param_groups for p in group["params"])
        state["step"] += 1
        current = state["pass"]
        w.rec.add(
            "step",
            n=state["step"],
            backward=state["backward"],
            synced=state["synced"],
            forward=state["forward"],
            items=state["items"],
            loader=current and current["loader"],
            prepared=state["prepared"],
            last=state["last"],
        )
    state.update(backward=0, synced=0, forward=0, prepared=0, last=None, items={}, evaluating=False)


@watches("torch.optim.Optimizer", "__init__", step=4, label="an optimizer made")
def optimizer_init(original, w, _):
    def optimizer_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        with Quietly(w):
            at = where()  # the script's line that made it (its class's __init__ is torch's)
            if at is not None and not w.of.get(self):
                w.of.set(self, True)
                w.rec.add("optim", at=at, tensors=sum(len(g["params"]) for g in self.param_groups))

    return optimizer_init


@watches("torch.distributed.fsdp", "fully_shard", step=4, label="fully_shard()")
@watches("torch.distributed.fsdp._fully_shard._fully_shard", "fully_shard", step=4, label="fully_shard()")
def fully_shard(original, w, _):
    def fully_shard(module, *args, **kwargs):
        result = original(module, *args, **kwargs)
        with Quietly(w):
            if called_by_user():
                sharded(w, module if result is None else result, "fully_shard")
        return result

    return fully_shard


@watches("torch.distributed.fsdp.FullyShardedDataParallel", "__init__", step=4, label="FSDP(...)")
def fsdp1_init(original, w, _):
    def fsdp1_init(self, module, *args, **kwargs):
        original(self, module, *args, **kwargs)
        with Quietly(w):
            if called_by_user():
                sharded(w, self, "FullyShardedDataParallel")

    return fsdp1_init


def sharded(w, module, how):
    """A model the script sharded: recorded with its local shards summed, its evaluations watched (a
    forward hook on it: only the outermost sharded model's forward counts), and its parameters (not
    gathered) are what the end's record sums."""
    import torch.distributed as dist

    inner = getattr(module, "_fsdp_wrapped_module", module)
    w.sharded.append(weakref.ref(module))
    w.weights[:] = list(module.parameters())
    w.rec.add(
        "shard",
        at=where(),
        how=how,
        module=type(inner).__name__.removeprefix("FSDP"),
        parameters=sum(local(p).numel() for p in module.parameters()),
        local=local_sum(module),
        ranks=dist.get_world_size() if dist.is_initialized() else None,
        devices=sorted({str(local(p).device) for p in module.parameters()}),
    )
    if not getattr(w.of.get(module), "get", lambda _: None)("sharded_hook"):
        pre = module.register_forward_pre_hook(functools.partial(sharded_forward, w, +1))
        post = module.register_forward_hook(functools.partial(sharded_forward, w, -1))
        entry = w.of.set(module, w.of.get(module) or {"hooks": []})
        entry["hooks"] += [pre, post]
        entry["sharded_hook"] = True


def sharded_forward(w, depth, module, args, *output):
    """Around a sharded model's forward: the outermost one without gradients is an evaluation (which
    all-gathers the parameters on every rank that runs it)."""
    with Quietly(w):
        if depth > 0 and not w.state.get("in_sharded") and not grad_enabled():
            import torch

            evaluated(w, next((a for a in args if isinstance(a, torch.Tensor)), None), through="sharded")
        w.state["in_sharded"] = w.state.get("in_sharded", 0) + depth


@watches("torch", "compile", step=4, label="torch.compile()")
@watches("torch.nn.Module", "compile", step=4, label="Module.compile()")
def watched_compile(original, w, name):
    import torch
    from torch.nn.parallel import DistributedDataParallel

    how = "torch.compile" if original.__qualname__ == "compile" else "Module.compile"

    def watched_compile(*args, **kwargs):
        target = args[0] if args else kwargs.get("model")
        with Quietly(w):
            if isinstance(target, torch.nn.Module):
                drop_hooks(w, target.module if isinstance(target, DistributedDataParallel) else target)
        with Quietly(w):
            if called_by_user():
                w.rec.add(
                    "compile",
                    how=how,
                    at=where(),
                    wraps_ddp=isinstance(target, DistributedDataParallel),
                    target=type(target).__name__,
                )
        return original(*args, **kwargs)

    return watched_compile
