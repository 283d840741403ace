"""NCCL: gloo, between the CPUs; the GPUs each DDP (and FSDP) call names, asked for."""

import inspect
import os

from ..watch.frames import where
from ..watch.recorder import Quietly
from ..watch.registry import replaces, stands_in


@replaces("torch.distributed", "is_nccl_available")
def nccl_available(original, s, _):
    return lambda: True  # nccl, asked for, becomes gloo (init_on_gloo)


@stands_in("torch.distributed", "init_process_group", step=1, label="init_process_group()")
def init_on_gloo(original, s, _):
    signature = inspect.signature(original)

    def init_on_gloo(*args, **kwargs):
        given = signature.bind_partial(*args, **kwargs).arguments
        device_id = given.pop("device_id", None)
        if device_id is not None and s.index(device_id) is not None:
            s.ask(s.index(device_id), "device_id")
        backend = given.get("backend")
        if backend is None or "nccl" in str(backend).lower():
            given["backend"] = "gloo"  # nccl moves tensors between GPUs; gloo, between CPUs
        return original(**given)

    return init_on_gloo


@stands_in("torch.distributed", "new_group", step=1, label="dist.new_group()")
def new_group_on_gloo(original, s, _):
    def new_group_on_gloo(*args, **kwargs):
        if "nccl" in str(kwargs.get("backend", "")).lower():
            kwargs["backend"] = "gloo"
        return original(*args, **kwargs)

    return new_group_on_gloo


@stands_in("torch.distributed", "barrier", step=5, label="dist.barrier()")
def barrier_on_gloo(original, s, _):
    def barrier_on_gloo(*args, device_ids=None, **kwargs):
        for index in device_ids or ():
            s.ask(s.index(index), "barrier")
        return original(*args, **kwargs)

    return barrier_on_gloo


@stands_in("torch.nn.parallel.DistributedDataParallel", "__init__", step=4, label="DDP(...)")
def ddp_on_cpu(original, s, _):
    signature = inspect.signature(original)

    def ddp_on_cpu(self, *args, **kwargs):
        given = signature.bind_partial(self, *args, **kwargs).arguments
        for key in ("device_ids", "output_device"):
            asked = given.pop(key, None)
            for device in asked if isinstance(asked, (list, tuple)) else [asked]:
                if s.index(device) is not None:
                    s.ask(s.index(device), key)
        original(**given)
        with Quietly(s):
            s.drop_hook(self.module)  # where its first batch comes from: its DDP forward says it now
            devices = sorted({s.placed(p) for p in self.module.parameters()})
            s.rec.add("ddp_gpus", at=where(), devices=devices)

    return ddp_on_cpu


@stands_in("torch.distributed.device_mesh", "init_device_mesh", step=4, label="init_device_mesh()")
@stands_in("torch.distributed", "init_device_mesh", step=4, label="init_device_mesh()")
def device_mesh_on_cpu(original, s, _):
    def device_mesh_on_cpu(device_type, *args, **kwargs):
        # a mesh of the node's GPUs: of its CPUs, over gloo, as the group is. Of GPUs, torch's own sets
        # the GPU of LOCAL_RANK where the script chose none
        of_gpus = str(device_type).startswith("cuda")
        if of_gpus and s.chosen is None and "LOCAL_RANK" in os.environ:
            s.set_device(int(os.environ["LOCAL_RANK"]) % max(1, len(s.visible())))
        mesh = original("cpu" if of_gpus else device_type, *args, **kwargs)
        if of_gpus:
            s.meshes.set(mesh, True)
        return mesh

    return device_mesh_on_cpu


@stands_in("torch.distributed.fsdp", "fully_shard", step=4, label="fully_shard()")
@stands_in("torch.distributed.fsdp._fully_shard._fully_shard", "fully_shard", step=4, label="fully_shard()")
def fully_shard_on_cpu(original, s, _):
    def fully_shard_on_cpu(module, *args, **kwargs):
        # where the script put the parameters this call shards (those a call before sharded are new);
        # fully_shard moves them to its mesh's device, on a mesh of GPUs the current GPU (its own
        # mesh, where the script gives none, is of GPUs wherever there are some)
        fresh = [p for p in module.parameters() if type(p).__name__ != "DTensor"]
        mesh = kwargs.get("mesh")
        devices = sorted({s.placed(p) for p in fresh})
        if fresh and (mesh is None or s.meshes.get(mesh, False)):
            devices = [f"cuda:{s.gpu}"]
        result = original(module, *args, **kwargs)
        with Quietly(s):
            s.drop_hook(module)  # its first batch: the sharded forward's
            if devices:
                s.rec.add("ddp_gpus", at=where(), devices=devices)
                if devices[0].startswith("cuda"):
                    for p in module.parameters():
                        s.on_gpu(p, s.gpu)
        return result

    return fully_shard_on_cpu


@stands_in("torch.distributed.fsdp.FullyShardedDataParallel", "__init__", step=4, label="FSDP(...)")
def fsdp1_on_cpu(original, s, _):
    import torch

    signature = inspect.signature(original)

    def fsdp1_on_cpu(self, *args, **kwargs):
        given = signature.bind_partial(self, *args, **kwargs).arguments
        devices = sorted({s.placed(p) for p in given["module"].parameters()})
        device_id = given.pop("device_id", None)
        if device_id is not None and s.index(device_id) is not None:
            devices = [f"cuda:{s.ask(s.index(device_id), 'device_id')}"]  # FSDP moves the model there
        # torch 2.13's FSDP, with no accelerator, runs on the CPU only where its device_id says so
        original(**given, device_id=torch.device("cpu"))
        with Quietly(s):
            s.rec.add("ddp_gpus", at=where(), devices=devices)

    return fsdp1_on_cpu


@stands_in(
    "torch.nn.parallel.DistributedDataParallel", "forward", step=4, label="DDP forward", compiled_through=True
)
def ddp_forward_standin(original, s, _):
    def ddp_forward(self, *args, **kwargs):
        s.note_input(self, args, kwargs)
        return original(self, *args, **kwargs)

    return ddp_forward
