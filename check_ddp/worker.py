"""2. record: what each of the job's processes runs before the script (check_ddp.run's sitecustomize
loads it): watch() puts the watcher's wrappers (check_ddp.watch) around what a DDP script calls, and,
where CUDA and NCCL are stood in on the CPU, the stand-in's first (check_ddp.standin); each writes
records of the kinds check_ddp.records declares. Nothing it loads imports the judge."""

import functools
import json
import os
import sys
from pathlib import Path

from .records import FORMAT, SCHEMA
from .standin import cuda, devices, nccl  # noqa: F401 (the stand-in's wrappers, registered)
from .standin.node import StandIn
from .watch import collectives, data, files, frames  # noqa: F401 (the watcher's wrappers, registered)
from .watch.ending import at_exit, excepthook
from .watch.files import audit
from .watch.launch import LAUNCH_VARIABLES
from .watch.model import after_step, note_forward
from .watch.recorder import Recorder
from .watch.registry import WRAPPERS, apply, keep_torchscript_builtins, missing_names
from .watch.watcher import Watcher


def recorder():
    """A digest of what is recorded: the record kinds and their fields (OPTIONAL's left out: a field
    added with its default keeps older jobs readable), and the calls watched. A job folder made by
    another recorder is not judged (--judge says so): its records may lack what today's rules read,
    or hold what they no longer mean."""
    import hashlib

    watched = sorted(f"{w.key}:{w.standin}" for w in WRAPPERS)
    text = json.dumps({"format": FORMAT, "schema": SCHEMA, "watched": watched}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def watch():
    """Wrap what a DDP script calls, in this process of the job, and record what it does."""
    node, node_gpus = rehearse_nodes()  # before the script, or torch, reads the environment
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    frames.TORCH_DIR = os.path.realpath(os.path.dirname(torch.__file__))
    rank = int(os.environ["RANK"])
    rec = Recorder(Path(os.environ["CHECK_DDP_FOLDER"]) / f"rank{rank}.jsonl")
    standin = os.environ.get("CHECK_DDP_STANDIN") == "1"
    rec.add(
        "start",
        rank=rank,
        local_rank=int(os.environ["LOCAL_RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        node=node,
        local_world_size=int(os.environ["LOCAL_WORLD_SIZE"]),
        standin=standin,
        cuda=standin or torch.cuda.is_available(),
        gpus=node_gpus if standin else torch.cuda.device_count(),
        torch=torch.__version__,
        env={k: os.environ.get(k) for k in LAUNCH_VARIABLES},
    )
    os.register_at_fork(after_in_child=lambda: setattr(rec, "enabled", False))  # DataLoader workers
    # a torch that renamed what the watcher relies on: the check is incomplete, and says so (looked up
    # before anything is wrapped: the lookup makes objects of torch's, which must not be recorded)
    for name in missing_names(imported_only=True):
        rec.add(
            "fault",
            type="missing",
            message=f"this torch has no {name}: check_ddp.py does not know it",
            at=name,
        )
    watcher, replaced = Watcher(rec), []  # replaced: (original, what is in its place)
    # torch.compile traces none of the watcher's own work on a forward
    watcher.note_forward = torch.compiler.disable(functools.partial(note_forward, watcher))
    if standin:  # first, so that the watcher's wrapper of a call sees what the script passed
        stand_in = StandIn(rec, node_gpus)
        for wrapper in (wrapper for wrapper in WRAPPERS if wrapper.standin):
            apply(wrapper, stand_in, replaced)
    for wrapper in (wrapper for wrapper in WRAPPERS if not wrapper.standin):
        apply(wrapper, watcher, replaced)
    keep_torchscript_builtins(replaced)
    register_optimizer_step_post_hook(functools.partial(after_step, watcher))
    sys.addaudithook(functools.partial(audit, watcher))
    sys.excepthook = functools.partial(excepthook, watcher, sys.excepthook)
    import atexit

    atexit.register(at_exit, watcher)


def rehearse_nodes():
    """Show this process the node torchrun would have put it on, in a job of CHECK_DDP_NNODES nodes
    with as many processes each: its LOCAL_RANK, LOCAL_WORLD_SIZE and GROUP_RANK, as on the real
    thing, so that RANK and LOCAL_RANK differ from the second node on. On real GPUs, the node's
    own GPUs only (CUDA_VISIBLE_DEVICES), as on a machine of its own. (its node, its node's GPUs)"""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    nodes = int(os.environ.get("CHECK_DDP_NNODES", "1"))
    per_node = world // nodes
    node = rank // per_node
    os.environ.update(
        LOCAL_RANK=str(rank % per_node),
        LOCAL_WORLD_SIZE=str(per_node),
        GROUP_RANK=str(node),
        GROUP_WORLD_SIZE=str(nodes),
    )
    gpus = os.environ.get("CHECK_DDP_GPUS")
    if nodes > 1 and gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(
            gpus.split(",")[node * per_node : (node + 1) * per_node]
        )
    if os.environ.get("CHECK_DDP_AS_LAUNCHER") == "1":
        os.environ.update(as_its_launcher(rank, world, node, nodes, per_node))
    return node, per_node


def as_its_launcher(rank, world, node, nodes, per_node):
    """Who this process is, as the other launchers say it (a run again as the launcher the script was
    written for, where it reads theirs, not torchrun's): SLURM's srun, Open MPI's and MPICH's mpirun,
    MVAPICH's. (A --local_rank option, torch.distributed.launch's, is passed by the watcher's
    parse_args.) No torchrun's store to join: rank 0 makes the store, at the port the job's batch file
    would export (MASTER_PORT), as under those launchers, whether the script names that port or its own."""
    local = rank % per_node
    said = {
        "SLURM_PROCID": rank, "SLURM_LOCALID": local, "SLURM_NTASKS": world, "SLURM_NODEID": node,
        "SLURM_NNODES": nodes, "SLURM_JOB_NUM_NODES": nodes, "SLURM_NTASKS_PER_NODE": per_node,
        "SLURM_GPUS_ON_NODE": per_node, "SLURM_NPROCS": world, "SLURM_CPUS_PER_TASK": 1,
        "SLURM_JOB_NODELIST": "localhost", "SLURM_NODELIST": "localhost", "SLURM_JOB_ID": 1, "SLURM_JOBID": 1,
        "SLURM_STEP_ID": 0,
        "OMPI_COMM_WORLD_RANK": rank, "OMPI_COMM_WORLD_SIZE": world, "OMPI_COMM_WORLD_LOCAL_RANK": local,
        "OMPI_COMM_WORLD_LOCAL_SIZE": per_node, "OMPI_COMM_WORLD_NODE_RANK": node,
        "PMI_RANK": rank, "PMI_SIZE": world, "MPI_LOCALRANKID": local, "MPI_LOCALNRANKS": per_node,
        "MV2_COMM_WORLD_RANK": rank, "MV2_COMM_WORLD_SIZE": world, "MV2_COMM_WORLD_LOCAL_RANK": local,
        "MASTER_PORT": os.environ["CHECK_DDP_LAUNCHER_PORT"], "TORCHELASTIC_USE_AGENT_STORE": False,
    }  # fmt: skip
    return {key: str(value) for key, value in said.items()}
