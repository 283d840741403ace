"""DDP steps 5, 6 and 9: the script's own collectives, each with where it was called and after how
many optimizer steps; a full state dict gathered (a collective of torch's); .item() on the host."""

import inspect

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
    "get_state_dict", step=6, label="{name}()",
)  # fmt: skip
def state_dict_gather(original, w, name):
    signature = inspect.signature(original)

    def state_dict_gather(*args, **kwargs):
        with Quietly(w):
            options = signature.bind_partial(*args, **kwargs).arguments.get("options")
            if called_by_user() and getattr(options, "full_state_dict", False):  # a gather: a collective
                w.rec.add("coll", name=name, at=where(), step=w.state["step"], group=None)
        return original(*args, **kwargs)

    return state_dict_gather


@watches("torch.Tensor", "item", step=5, label=".item()")
def tensor_item(original, w, _):
    def tensor_item(self):
        with Quietly(w):
            if called_by_user():
                at = where()
                w.state["items"][at] = w.state["items"].get(at, 0) + 1
        return original(self)

    return tensor_item
