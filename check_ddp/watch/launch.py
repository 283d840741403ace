"""DDP steps 1 and 8: the launch variables the script writes and reads, the process group it makes and
destroys, an option named like a local rank, and processes the script starts of its own."""

import inspect
import os
import re
import sys
import time
import types

from .evidence import dist_initialized
from .files import observe_writes
from .frames import is_users, outside_stdlib, where
from .recorder import Quietly
from .registry import watches

LAUNCH_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")


# In a run again with the script's own launch set aside (see set_aside): its writes of LAUNCH_VARIABLES
# and its init_process_group() rendezvous (init_method, rank, world_size, store) are recorded, and not
# made: torchrun's stand, so that the rest of the script can be checked
KEEP_LAUNCH = os.environ.get("CHECK_DDP_KEEP_LAUNCH") == "1"
# In a run again as the launcher the script was written for (see check_ddp.worker's as_its_launcher): a
# --local_rank option of the script's is passed its value, as torch.distributed.launch passed it
AS_LAUNCHER = os.environ.get("CHECK_DDP_AS_LAUNCHER") == "1"


@watches("os._Environ", "__setitem__", step=1, label="os.environ[...] = ...")
def environ_setitem(original, w, _):
    def environ_setitem(self, key, value):
        kept = False
        with Quietly(w):
            if self is os.environ and key in LAUNCH_VARIABLES and os.environ.get(key) != value:
                w.rec.add("env", key=key, value=value, torchrun=os.environ.get(key), at=where())
                kept = KEEP_LAUNCH  # a run again with the script's launch set aside: torchrun's value stays
        return None if kept else original(self, key, value)

    return environ_setitem


@watches("torch.distributed", "init_process_group", step=1, label="init_process_group()")
def init_process_group(original, w, _):
    import torch.distributed as dist

    signature = inspect.signature(original)

    def init_process_group(*args, **kwargs):
        with Quietly(w):
            observe_writes(w)
            given = signature.bind_partial(*args, **kwargs).arguments
            if KEEP_LAUNCH:  # a run again with the script's launch set aside: what torchrun set, as env://
                bound = {
                    k: v for k, v in given.items() if k not in ("init_method", "rank", "world_size", "store")
                }
                args, kwargs = (), bound
            w.rec.add(
                "init",
                at=where(),
                backend=str(given.get("backend")),
                init_method=given.get("init_method"),
                rank=given.get("rank"),
                world_size=given.get("world_size"),
                store="store" in given,
            )
        start = time.monotonic()
        result = original(*args, **kwargs)
        with Quietly(w):
            w.rec.add(
                "met",
                seconds=time.monotonic() - start,
                rank=dist.get_rank(),
                world_size=dist.get_world_size(),
                backend=str(dist.get_backend()),
            )
        return result

    return init_process_group


@watches("torch.distributed", "destroy_process_group", step=7, label="destroy_process_group()")
def destroy_process_group(original, w, _):
    def destroy_process_group(*args, **kwargs):
        with Quietly(w):
            if not args and not kwargs:  # the whole job's group, not a subgroup
                w.rec.add("destroy", at=where())
        return original(*args, **kwargs)

    return destroy_process_group


# A script that starts its own processes to train in (mp.spawn, a Process of its own function)
# would, under torchrun, start N of them in each of the N processes. The check starts none: each of
# torchrun's processes runs in itself the one child it stands for (child LOCAL_RANK, as the
# launcher numbers them on a node), so that what the children do (where they meet, what they pass
# init_process_group(), where they fail) is seen, and judged.
@watches("torch.multiprocessing", "spawn", "start_processes", step=8, label="mp.{name}()")
@watches("torch.multiprocessing.spawn", "spawn", "start_processes", step=8, label="mp.{name}()")
def multiprocessing_spawn(original, w, name):
    import types

    signature = inspect.signature(original)

    def multiprocessing_spawn(*args, **kwargs):
        given = signature.bind(*args, **kwargs).arguments
        nprocs = given.get("nprocs", 1)
        child = int(os.environ["LOCAL_RANK"]) % max(1, nprocs)
        with Quietly(w):
            w.rec.add("spawn", how=f"torch.multiprocessing.{name}(nprocs={nprocs})", at=where())
        given["fn"](child, *given.get("args", ()))  # the child this process stands for, here
        # join=False gives a context to join later: the child has run, so it is joined already
        return (
            None if given.get("join", True) else types.SimpleNamespace(join=lambda *a, **k: True, pids=list)
        )

    return multiprocessing_spawn


@watches("multiprocessing.process.BaseProcess", "start", step=8, label="Process.start()")
def process_start(original, w, name):
    def process_start(self):
        # the script's own function in a process of its own, from a process that has no group of its
        # own: a launch (a DataLoader's workers, a Pool's, torch's compile workers run library code)
        target = self._target or type(self).run
        code = getattr(target, "__code__", None)
        launch = w.rec.enabled and code is not None and is_users(code.co_filename)
        if not launch or dist_initialized():
            return original(self)
        w.state["children"] = w.state.get("children", 0) + 1
        w.of.set(self, "child")
        # to the script, a child that ran and ended well (its exitcode 0, not alive): the one this process
        # stands for runs here; the others are the other processes' of the job
        self._popen = types.SimpleNamespace(
            poll=lambda: 0, wait=lambda timeout=None: 0, terminate=lambda: None, kill=lambda: None,
            close=lambda: None, returncode=0, pid=os.getpid(), sentinel=None,
        )  # fmt: skip
        if w.state["children"] - 1 == int(os.environ["LOCAL_RANK"]):  # the child this process stands for
            w.rec.add(
                "spawn", how=f"a Process running {getattr(target, '__qualname__', 'its run()')}", at=where()
            )
            self.run()
        return None

    return process_start


@watches("multiprocessing.process.BaseProcess", "join", step=8, label="Process.join()")
def process_join(original, w, name):
    def process_join(self, timeout=None):
        return None if w.of.get(self) == "child" else original(self, timeout)

    return process_join


READ_KEYS = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK")


# who a process is, as other launchers say it: Open MPI's mpirun, MPICH/Intel MPI's (PMI, MPI_LOCALRANKID),
# MVAPICH's, SLURM's srun
OTHER_LAUNCHERS = re.compile(
    r"OMPI_COMM_WORLD_(LOCAL_)?(RANK|SIZE)|PMI_(RANK|SIZE)|MPI_LOCALRANKID|MV2_COMM_WORLD_(LOCAL_)?RANK"
    r"|SLURM_(PROCID|LOCALID|NTASKS)"
)
# any other variable a launcher sets (SLURM's, MPI's, LSF's and jsrun's, PBS's, torchrun's own): a script that
# reads one expects that launcher, and a line that fails on one fails on its launch
LAUNCHER_OWNED = re.compile(r"(SLURM|OMPI|PMIX?|MV2|MPI|LSB|JSM|PBS|TORCHELASTIC)_\w+|GROUP_WORLD_SIZE")
# a process's number on its node, as each launcher says it: the GPU it takes
LOCAL_RANK_KEYS = (
    "LOCAL_RANK",
    "SLURM_LOCALID",
    "OMPI_COMM_WORLD_LOCAL_RANK",
    "MPI_LOCALRANKID",
    "MV2_COMM_WORLD_LOCAL_RANK",
)


@watches("os._Environ", "__getitem__", step=8, label="os.environ[...]")
def environ_getitem(original, w, _):
    def environ_getitem(self, key):
        with Quietly(w):
            who = key in READ_KEYS or OTHER_LAUNCHERS.fullmatch(str(key))
            if self is os.environ and (who or LAUNCHER_OWNED.fullmatch(str(key))):
                frame = outside_stdlib()
                by = "script" if frame is not None and is_users(frame.f_code.co_filename) else "library"
                # each line that reads it, once: a check of it (.get) and the read that fails on its value
                line = (key, frame.f_code, frame.f_lineno) if frame is not None else key
                # torch's own reads of another launcher's variables are not the script's expectation: not kept
                if (who or by == "script") and line not in w.read:
                    w.read.add(line)
                    w.rec.add("read", key=key, by=by, at=where(), found=key in os.environ)
        return original(self, key)

    return environ_getitem


@watches("argparse.ArgumentParser", "parse_known_args", step=8, label="parser.parse_args()")
def parse_known_args(original, w, _):
    def parse_known_args(self, args=None, namespace=None):
        if AS_LAUNCHER and args is None:  # as torch.distributed.launch started it: --local_rank=N passed
            args = sys.argv[1:] + local_rank_argument(self, sys.argv[1:])
        try:
            parsed = original(self, args, namespace)
        except SystemExit:  # refused what it was given: one it requires missing (--local_rank=...)
            with Quietly(w):
                refused_local_rank(w, self, sys.argv[1:] if args is None else list(args))
            raise
        with Quietly(w):
            given = sys.argv[1:] if args is None else list(args)
            for action in self._actions:
                options = [o for o in action.option_strings if re.fullmatch(r"--(local[-_])?rank", o)]
                frame = outside_stdlib()
                if options and frame is not None and is_users(frame.f_code.co_filename):
                    w.rec.add(
                        "arg",
                        option=options[0],
                        value=getattr(parsed[0], action.dest, None),
                        default=action.default,
                        given=any(a == o or a.startswith(o + "=") for a in given for o in options),
                        at=where(),
                    )
        return parsed

    return parse_known_args


def local_rank_argument(parser, given):
    """[--local_rank=N], N this process's LOCAL_RANK, where the parser has such an option and it is not
    given: what torch.distributed.launch passed each process; else []."""
    for action in parser._actions:
        options = [o for o in action.option_strings if re.fullmatch(r"--local[-_]rank", o)]
        if options and not any(a == o or a.startswith(o + "=") for a in given for o in options):
            return [f"{options[0]}={os.environ['LOCAL_RANK']}"]
    return []


def refused_local_rank(w, parser, given):
    """The script's parser refused its arguments, and it requires a --local_rank option not given: what
    torch.distributed.launch passed and torchrun does not. Recorded as the option, with no value."""
    for action in parser._actions:
        options = [o for o in action.option_strings if re.fullmatch(r"--local[-_]rank", o)]
        given_here = any(a == o or a.startswith(o + "=") for a in given for o in options)
        frame = outside_stdlib()
        if (
            options
            and action.required
            and not given_here
            and frame is not None
            and is_users(frame.f_code.co_filename)
        ):
            w.rec.add(
                "arg",
                option=options[0],
                value=None,
                default=action.default,
                given=False,
                at=where(),
                refused=True,
            )
