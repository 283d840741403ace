"""DDP steps 5, 6 and 9: the script's own collectives, each with where it was called and after how
many optimizer steps; a full state dict gathered (a collective of torch's); .item() on the host."""

import inspect
import os

from .files import observe_writes
from .frames import called_by_user, where
from .recorder import Quietly
from .registry import watches

# DDP steps 5, 6, 9: the script's own collectives, each with where it was called
COLLECTIVES = (
    "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "barrier", "monitored_barrier", "broadcast_object_list", "all_gather_object",
    "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all", "all_to_all_single",
)  # fmt: skip


REDUCING = ("all_reduce", "reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "gather")


@watches("torch.distributed", *COLLECTIVES, step=5, label="dist.{name}()")
def collective(original, w, name):
    import torch.distributed as dist

    signature = inspect.signature(original)

    def watched_collective(*args, **kwargs):
        with Quietly(w):
            observe_writes(w)
            if called_by_user():
                group = signature.bind_partial(*args, **kwargs).arguments.get("group")
                some = group is not None and group is not dist.group.WORLD
                ranks = dist.get_process_group_ranks(group) if some and dist.is_initialized() else None
                w.rec.add("coll", name=name, at=where(), step=w.state["step"], group=ranks)
        return original(*args, **kwargs)

    return watched_collective


@watches(
    "torch.distributed.checkpoint.state_dict", "get_model_state_dict", "get_optimizer_state_dict",
    "get_state_dict", "set_model_state_dict", "set_optimizer_state_dict", "set_state_dict", step=6,
    label="{name}()",
)  # fmt: skip
def state_dict_gather(original, w, name):
    """A sharded model's state gathered whole (full_state_dict=True), or given out from rank 0's
    (broadcast_from_rank0=True): collectives of torch's, which every rank must call."""
    signature = inspect.signature(original)
    exchange = "broadcast_from_rank0" if name.startswith("set_") else "full_state_dict"

    def state_dict_gather(*args, **kwargs):
        with Quietly(w):
            options = signature.bind_partial(*args, **kwargs).arguments.get("options")
            if called_by_user() and getattr(options, exchange, False):
                w.rec.add("coll", name=name, at=where(), step=w.state["step"], group=None)
        return original(*args, **kwargs)

    return state_dict_gather


@watches("torch.distributed.checkpoint", "save", "async_save", "load", step=6, label="dcp.{name}()")
def sharded_checkpoint(original, w, name):
    """torch.distributed.checkpoint's save and load: every rank writes (or reads) its own shards, and the
    ranks agree on a plan first: collectives, which every rank must call (unless no_dist=True)."""
    signature = inspect.signature(original)

    def sharded_checkpoint(*args, **kwargs):
        with Quietly(w):
            given = signature.bind_partial(*args, **kwargs).arguments
            if called_by_user() and not given.get("no_dist"):
                path = given.get("checkpoint_id")
                path = os.path.abspath(os.fspath(path)) if isinstance(path, (str, os.PathLike)) else None
                w.rec.add("coll", name=f"dcp.{name}", at=where(), step=w.state["step"], group=None, path=path)
                if path and name != "load":
                    w.sharded_saves.add(path)
        return original(*args, **kwargs)

    return sharded_checkpoint


@watches("torch.Tensor", "item", step=5, label=".item()")
def tensor_item(original, w, _):
    def tensor_item(self):
        with Quietly(w):
            if called_by_user():
                at = where()
                w.state["items"][at] = w.state["items"].get(at, 0) + 1
        return original(self)

    return tensor_item
