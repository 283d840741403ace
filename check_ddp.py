"""Check a DDP training script by running it: one line per DDP step, ok, warn or FAIL, with evidence.

    python check_ddp.py my_train.py                    # your script, with its own defaults
    python check_ddp.py my_train.py --epochs 2         # and with its own arguments
    python check_ddp.py --nproc 4 --silence 60 my_train.py

It starts your script as a small job, `torchrun --standalone --nproc_per_node=2 my_train.py ...`
(on a machine without enough GPUs, on the CPU, with gloo), watches every process from the
inside without changing your script, and reports on the steps of README.md: what each rank
did (the sampler's indices, the model's wrapper, the collectives, the files written, the
weights at the end), where (your file:line), what to do, and the pitfall that shows the
mistake. Its own options come before the script; everything after the script is the
script's. The job runs for real, in this folder: it writes what your script writes.

Exit status: 0 when no step failed (warnings included), 1 when one did, 2 for a usage error.
A job that stops making progress for --silence seconds is stopped, and the report says where
each rank was waiting. One self-contained file: copy it into your own project.
"""

import argparse
import ast
import functools
import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import threading
import time
from pathlib import Path

STEPS = {  # the names of README.md's table of steps
    1: "init the process group",
    2: "place each process on its device",
    3: "shard the data",
    4: "wrap the model",
    5: "all-reduce the metrics",
    6: "checkpoint on rank 0",
    7: "clean up",
    8: "launch with torchrun",
    9: "accumulate gradients with no_sync",
    10: "evaluate exactly",
}
PITFALLS = {  # the programs in pitfalls/ that show each mistake, run alone
    "master_port": "pitfalls/01_hardcoded_master_port.py",
    "rank_zero_collective": "pitfalls/02_collective_on_rank_zero.py",
    "set_epoch": "pitfalls/03_missing_set_epoch.py",
    "unseeded": "pitfalls/04_unseeded_dataset.py",
    "global_rank_device": "pitfalls/05_global_rank_as_device.py",
    "wrapped_state_dict": "pitfalls/06_wrapped_state_dict.py",
    "metrics": "pitfalls/07_metric_averaging.py",
    "early_stop": "pitfalls/08_early_stop_on_one_rank.py",
    "unused_parameter": "pitfalls/09_unused_parameter.py",
    "no_sync": "pitfalls/11_accumulation_without_no_sync.py",
    "unsafe_load": "pitfalls/12_unsafe_torch_load.py",
    "notebook": "pitfalls/14_ddp_inside_a_notebook_cell.py",
    "compile_order": "pitfalls/15_compile_and_ddp_order.py",
    "uneven": "pitfalls/16_uneven_inputs.py",
}
LAUNCH_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="check_ddp.py",
        description=__doc__.splitlines()[0],
        epilog="Options go before the script; what follows the script is passed to it.",
    )
    parser.add_argument("--nproc", type=int, default=2, help="processes to start (default: 2)")
    parser.add_argument(
        "--silence",
        type=float,
        default=20,
        help="seconds without progress after which the job is stopped as hung (default: 20)",
    )
    parser.add_argument("--cpu", action="store_true", help="run on the CPU (gloo) even where there are GPUs")
    parser.add_argument("-v", "--verbose", action="store_true", help="show the job's own output as it runs")
    parser.add_argument("script", help="your training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its own arguments")
    options = parser.parse_args(argv)
    if not Path(options.script).is_file():
        parser.error(f"{options.script}: no such file")
    if options.nproc < 2:
        parser.error("--nproc must be at least 2: one process cannot share anything")
    if options.silence <= 0:
        parser.error("--silence must be more than 0 seconds")
    job = run_job(options)
    lines = judge(job)
    print(report(job, lines))
    return 1 if any(line.verdict == "FAIL" for line in lines) else 0


# -----------------------------------------------------------------------------
# running the job: torchrun, with a watcher in each of its processes


class Job:
    """What a run of the script left: each rank's records, torchrun's output and exit status."""

    def __init__(self, options, command, device):
        self.options, self.command, self.device = options, command, device
        self.ranks = {}  # rank: its records, in order
        self.output = ""
        self.returncode = None
        self.seconds = 0.0
        self.hung = False  # stopped after --silence seconds without progress
        self.stuck_at_exit = False  # every rank finished its script, but a process did not end
        self.folder = None

    def records(self, kind, rank=None):
        ranks = self.ranks.items() if rank is None else [(rank, self.ranks.get(rank, []))]
        return [(r, e) for r, events in ranks for e in events if e["e"] == kind]


def visible_gpus(options):
    """The GPUs the job's processes will see. CUDA_VISIBLE_DEVICES="" hides them all: then torch,
    seconds to import, is not needed to know it."""
    if options.cpu or os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return 0
    import torch

    return torch.cuda.device_count()


def run_job(options):
    gpus = visible_gpus(options)
    device = "cuda" if gpus >= options.nproc else "cpu"
    folder = Path(tempfile.mkdtemp(prefix="check_ddp-"))
    site = folder / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ, CHECK_DDP_FOLDER=str(folder), CHECK_DDP_TOOL=str(Path(__file__).resolve()))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # --cpu, or fewer GPUs than processes: the CPU, as on a laptop
    launch = ["--standalone", f"--nproc_per_node={options.nproc}"]
    command = [sys.executable, "-m", "torch.distributed.run", *launch, options.script, *options.args]
    job = Job(options, ["torchrun", *launch, options.script, *options.args], device)
    job.folder = folder
    log = folder / "output.log"
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        seen, quiet_since = None, time.monotonic()
        shown = 0
        while proc.poll() is None:
            time.sleep(0.2)
            if options.verbose:
                shown = show_new_output(log, shown)
            records = sorted(folder.glob("rank*.jsonl"))
            sizes = tuple(p.stat().st_size for p in records) + (log.stat().st_size,)
            # until every process has started (Python, torch), a minute: start-up is not a hang
            allowed = options.silence if len(records) == options.nproc else max(options.silence, 60)
            if sizes != seen:
                seen, quiet_since = sizes, time.monotonic()
            elif time.monotonic() - quiet_since > allowed:
                finished = records and all(
                    re.search(r'"e": "(exit|ddp_freed)"', p.read_text()) for p in records
                )
                if not finished:
                    job.hung = True
                    stop(proc)
                elif time.monotonic() - quiet_since > allowed + 10:  # done, but not gone
                    job.stuck_at_exit = True
                    stop(proc)
    if options.verbose:
        show_new_output(log, shown)
    job.seconds = time.monotonic() - start
    job.returncode = proc.returncode
    job.output = log.read_text(errors="replace")
    for path in folder.glob("rank*.jsonl"):
        lines = path.read_text().splitlines()
        job.ranks[int(path.stem[4:])] = [json.loads(line) for line in lines if line.endswith("}")]
    return job


def stop(proc):
    """Stop a hung job: torchrun, told to stop, stops its workers; whatever is left is killed."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def show_new_output(log, shown):
    data = log.read_bytes()
    sys.stdout.write(data[shown:].decode(errors="replace"))
    sys.stdout.flush()
    return len(data)


# What each process of the job runs before its script: Python imports sitecustomize at start-up
# from the path. It watches only torchrun's workers (not torchrun itself, nor processes they
# start), then hands over to any sitecustomize this one hides.
SITECUSTOMIZE = """
import importlib.machinery, importlib.util, os, sys
if "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ and "CHECK_DDP_WATCHED" not in os.environ:
    os.environ["CHECK_DDP_WATCHED"] = str(os.getpid())
    _spec = importlib.util.spec_from_file_location("_check_ddp_watcher", os.environ["CHECK_DDP_TOOL"])
    _watcher = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_watcher)
    _watcher.watch()
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in sys.path if p != _here])
if _spec is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
"""


# -----------------------------------------------------------------------------
# what each rank records: runs inside the job's processes, around the calls a DDP script makes


class Recorder:
    """A rank's records, appended to rank<R>.jsonl by a background thread twice a second, which
    also notes where the main thread is: so that even a rank stuck in a collective, or killed,
    leaves what it did and where it waits."""

    def __init__(self, path):
        # reentrant: a record can be added while this thread flushes (a finalizer run by the garbage
        # collector, in the middle of a flush)
        self.path, self.pending, self.lock = path, [], threading.RLock()
        self.enabled = True
        self.position = None
        self.main = threading.main_thread().ident
        threading.Thread(target=self.flush_forever, daemon=True, name="check_ddp").start()

    def add(self, kind, **fields):
        if self.enabled:
            with self.lock:
                self.pending.append({"e": kind, **fields})

    def flush(self):
        with self.lock:
            events, self.pending = self.pending, []
        if events:
            with open(self.path, "a") as file:
                file.write("".join(json.dumps(e, default=str) + "\n" for e in events))

    def flush_forever(self):
        while True:
            time.sleep(0.5)
            position = main_thread_position(self.main)
            if position != self.position or position[3]:  # compiling: busy, however long one step takes
                self.position = position
                self.add("now", call=position[0], stack=position[1], inner=position[2])
            self.flush()


WATCHED = {}  # the code of each wrapper: the name of the call it wraps, as a user wrote it
TORCH_DIR = ""  # torch's own folder: frames in it are torch's, not the script's
LIBRARY_DIRS = tuple(
    os.path.realpath(p) for p in {sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}
)


def is_users(filename):
    """A frame of the script's own code, not torch's, the standard library's, or this file's."""
    path = os.path.realpath(filename)
    return not (
        filename.startswith("<")
        or path == os.path.realpath(__file__)
        or (TORCH_DIR and path.startswith(TORCH_DIR))
        or path.startswith(LIBRARY_DIRS)
    )


def place(frame):
    return f"{os.path.relpath(frame.f_code.co_filename)}:{frame.f_lineno}"


def where(skip=2):
    """file:line of the script's code that made the current call."""
    frame = sys._getframe(skip)
    while frame is not None and not is_users(frame.f_code.co_filename):
        frame = frame.f_back
    return place(frame) if frame is not None else None


def called_by_user(skip=2):
    """Whether the current call comes straight from the script's code (not from torch's own)."""
    return is_users(sys._getframe(skip).f_code.co_filename)


def main_thread_position(main):
    """(the watched call the main thread is in, or None; the script's lines it came from, innermost
    first; the innermost frame, which moves while it computes; whether torch is compiling)."""
    frame = sys._current_frames().get(main)
    call, stack, inner, compiling = None, [], place(frame) if frame else None, False
    while frame is not None:
        if call is None and not stack and frame.f_code in WATCHED:
            call = WATCHED[frame.f_code]
        if is_users(frame.f_code.co_filename):
            stack.append(place(frame))
        compiling = compiling or re.search(r"torch[/\\]_(dynamo|inductor)[/\\]", frame.f_code.co_filename)
        frame = frame.f_back
    del frame
    return call, stack[:8], inner, bool(compiling)


def fingerprint(value, depth=0):
    """A short summary of data, equal on two ranks exactly when the data is (tensors, arrays,
    numbers, strings, and lists, tuples and dicts of them)."""
    import hashlib

    import torch

    if isinstance(value, torch.Tensor):
        flat = value.detach().reshape(-1)
        step = max(1, flat.numel() // 65536)
        sample = flat[::step].cpu().contiguous()
        return f"{tuple(value.shape)}:{hashlib.blake2b(sample.numpy().tobytes(), digest_size=8).hexdigest()}"
    if type(value).__module__ == "numpy":
        return fingerprint(torch.as_tensor(value), depth)
    if isinstance(value, (list, tuple)) and depth < 3:
        return "[" + ",".join(fingerprint(v, depth + 1) for v in value[:16]) + "]"
    if isinstance(value, dict) and depth < 3:
        return "{" + ",".join(f"{k}={fingerprint(v, depth + 1)}" for k, v in list(value.items())[:16]) + "}"
    return repr(value)[:64]


def length_of(thing):
    try:
        return len(thing)
    except TypeError:  # an IterableDataset without a length, and its DataLoader
        return None


def dataset_fingerprint(dataset):
    """The dataset's data, or (for a dataset that makes its samples) four of its samples, drawn
    with every random generator seeded alike and then restored, so that the script's own
    randomness is untouched and random augmentations draw alike on every rank."""
    import random

    import torch

    tensors = dataset.tensors if hasattr(dataset, "tensors") else None
    stored = [
        v
        for v in getattr(dataset, "__dict__", {}).values()
        if isinstance(v, torch.Tensor) or type(v).__name__ == "ndarray"
    ]
    if tensors or stored:
        return fingerprint(list(tensors or stored))
    try:
        n = len(dataset)
    except TypeError:
        return None  # an IterableDataset: its batches are compared instead
    states = torch.random.get_rng_state(), random.getstate()
    numpy = sys.modules.get("numpy")
    numpy_state = numpy.random.get_state() if numpy else None
    try:
        samples = []
        for i in sorted({0, 1, n // 2, n - 1} & set(range(n))):
            torch.manual_seed(0)
            random.seed(0)
            if numpy:
                numpy.random.seed(0)
            samples.append(dataset[i])
        return fingerprint(samples)
    except Exception:
        return None
    finally:
        torch.random.set_rng_state(states[0])
        random.setstate(states[1])
        if numpy:
            numpy.random.set_state(numpy_state)


def watch():
    """Wrap what a DDP script calls, in this process of the job, and record what it does."""
    global TORCH_DIR
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.optim.optimizer import register_optimizer_step_post_hook
    from torch.utils.data import DataLoader, DistributedSampler
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    TORCH_DIR = os.path.realpath(os.path.dirname(torch.__file__))
    rank = int(os.environ["RANK"])
    rec = Recorder(Path(os.environ["CHECK_DDP_FOLDER"]) / f"rank{rank}.jsonl")
    rec.add(
        "start",
        rank=rank,
        local_rank=int(os.environ["LOCAL_RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        cuda=torch.cuda.is_available(),
        gpus=torch.cuda.device_count(),
        torch=torch.__version__,
        env={k: os.environ.get(k) for k in LAUNCH_VARIABLES},
    )
    os.register_at_fork(after_in_child=lambda: setattr(rec, "enabled", False))  # DataLoader workers
    state = {  # what happened since the last optimizer step
        "backward": 0,
        "synced": 0,
        "forward": 0,
        "items": {},
        "step": 0,
        "evaluations": 0,
        "pass": None,  # the DataLoader pass that gave the last batch
    }
    live_ddp = []  # weak references to the DDP models made
    weights = []  # the parameters of those models, or of the first optimizer: fingerprinted at exit
    inputs = []  # a fingerprint of each training forward's first input, kept on its device
    folder = os.path.realpath(os.environ["CHECK_DDP_FOLDER"])
    caches = os.path.realpath(os.path.expanduser("~/.cache"))

    def wrap(owner, name, label, make, compiled_through=False):
        original = getattr(owner, name, None)
        if original is None:
            return
        wrapper = functools.wraps(original)(make(original))
        # a code object of its own, so that a frame of it names its call (wrappers share their code)
        wrapper.__code__ = wrapper.__code__.replace(co_name=f"{wrapper.__code__.co_name}_{name}")
        WATCHED[wrapper.__code__] = label
        if compiled_through:  # torch.compile must not trace this watcher, only what it wraps, as before
            wrapper = torch.compiler.disable(wrapper, recursive=False)
        setattr(owner, name, wrapper)

    # DDP step 1: the launch variables the script writes, and the group it makes
    def set_item(original):
        def environ_setitem(self, key, value):
            if self is os.environ and key in LAUNCH_VARIABLES and os.environ.get(key) != value:
                rec.add("env", key=key, value=value, torchrun=os.environ.get(key), at=where())
            return original(self, key, value)

        return environ_setitem

    wrap(type(os.environ), "__setitem__", None, set_item)

    def init(original):
        import inspect

        signature = inspect.signature(original)

        def init_process_group(*args, **kwargs):
            given = signature.bind_partial(*args, **kwargs).arguments
            rec.add(
                "init",
                at=where(),
                backend=str(given.get("backend")),
                init_method=given.get("init_method"),
                rank=given.get("rank"),
                world_size=given.get("world_size"),
                store="store" in given,
            )
            rec.flush()
            start = time.monotonic()
            result = original(*args, **kwargs)
            rec.add(
                "met",
                seconds=time.monotonic() - start,
                rank=dist.get_rank(),
                world_size=dist.get_world_size(),
                backend=str(dist.get_backend()),
            )
            return result

        return init_process_group

    wrap(dist, "init_process_group", "init_process_group()", init)

    def destroy(original):
        def destroy_process_group(*args, **kwargs):
            if not args and not kwargs:  # the whole job's group, not a subgroup
                rec.add("destroy", at=where())
                rec.flush()  # on disk now: what follows may be a process that never ends
            return original(*args, **kwargs)

        return destroy_process_group

    wrap(dist, "destroy_process_group", "destroy_process_group()", destroy)

    # DDP steps 5, 6, 9: the script's own collectives, each with where it was called
    def collective(name):
        def make(original):
            def watched_collective(*args, **kwargs):
                if called_by_user():
                    rec.add("coll", name=name, at=where(), step=state["step"])
                return original(*args, **kwargs)

            return watched_collective

        return make

    for name in (
        "all_reduce",
        "reduce",
        "broadcast",
        "all_gather",
        "all_gather_into_tensor",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "barrier",
        "monitored_barrier",
        "broadcast_object_list",
        "all_gather_object",
        "gather",
        "gather_object",
        "scatter",
        "scatter_object_list",
        "all_to_all",
        "all_to_all_single",
    ):
        wrap(dist, name, f"dist.{name}()", collective(name))

    # DDP step 3: each DataLoader, its dataset and sampler, and the indices of every batch
    loaders = []

    def loader_init(original):
        def dataloader_init(self, *args, **kwargs):
            original(self, *args, **kwargs)
            if not called_by_user():
                return
            self._check_ddp_id = len(loaders)
            loaders.append(self)
            sampler, distributed = self.batch_sampler or self.sampler, None
            for _ in range(4):  # BatchSampler(DistributedSampler(...)), and the like
                if isinstance(sampler, DistributedSampler):
                    distributed = sampler
                    break
                sampler = getattr(sampler, "sampler", None)
            dataset, offset = self.dataset, None
            while hasattr(dataset, "indices") and hasattr(dataset, "dataset"):  # a Subset: the indices
                offset = (
                    [int(i) for i in dataset.indices]
                    if offset is None
                    else [offset[i] for i in dataset.indices]
                )
                dataset = dataset.dataset
            self._check_ddp_indices = offset
            rec.add(
                "loader",
                id=self._check_ddp_id,
                at=where(),
                dataset=type(dataset).__name__,
                length=length_of(dataset),
                batches=length_of(self),
                data=dataset_fingerprint(dataset),
                sampler=type(self.sampler).__name__,
                distributed=distributed is not None
                and {
                    "rank": distributed.rank,
                    "num_replicas": distributed.num_replicas,
                    "shuffle": distributed.shuffle,
                    "drop_last": distributed.drop_last,
                },
            )

        return dataloader_init

    wrap(DataLoader, "__init__", "DataLoader(...)", loader_init)

    def loader_iter(original):
        def dataloader_iter(self):
            iterator = original(self)
            if hasattr(self, "_check_ddp_id"):
                iterator._check_ddp_pass = {"loader": self._check_ddp_id, "batches": 0, "backward": 0}
                self._check_ddp_passes = getattr(self, "_check_ddp_passes", 0) + 1
                rec.add("pass", loader=self._check_ddp_id, n=self._check_ddp_passes, at=where())
            return iterator

        return dataloader_iter

    wrap(DataLoader, "__iter__", "iter(DataLoader)", loader_iter)

    def next_index(original):
        def dataloader_next_index(self):
            index = original(self)
            current = getattr(self, "_check_ddp_pass", None)
            if current is not None:
                indices = index if isinstance(index, (list, tuple)) else [index]
                if all(isinstance(i, int) for i in indices):  # a map-style dataset's indices
                    offset = loaders[current["loader"]]._check_ddp_indices
                    indices = [offset[i] for i in indices] if offset else list(indices)
                    rec.add("batch", loader=current["loader"], idx=indices)
            return index

        return dataloader_next_index

    wrap(_BaseDataLoaderIter, "_next_index", "next(DataLoader)", next_index)

    def loader_next(original):
        def dataloader_next(self):
            batch = original(self)
            current = getattr(self, "_check_ddp_pass", None)
            if current is not None:
                current["batches"] += 1
                state["pass"] = current
                if loaders[current["loader"]]._check_ddp_indices is None and self._dataset_kind == 1:
                    rec.add("batch", loader=current["loader"], data=fingerprint(batch))  # iterable
            return batch

        return dataloader_next

    wrap(_BaseDataLoaderIter, "__next__", "next(DataLoader)", loader_next)

    def set_epoch(original):
        def sampler_set_epoch(self, epoch):
            if called_by_user():
                rec.add("set_epoch", epoch=epoch, at=where())
            return original(self, epoch)

        return sampler_set_epoch

    wrap(DistributedSampler, "set_epoch", "sampler.set_epoch()", set_epoch)

    from torch.distributed.algorithms.join import Join

    def join(original):
        def join_init(self, *args, **kwargs):
            rec.add("join", at=where())
            return original(self, *args, **kwargs)

        return join_init

    wrap(Join, "__init__", "Join(...)", join)

    # DDP step 4: the wrapper, what goes through it, and the replicas' weights
    def ddp_freed(_):
        """The DDP model is being freed, training done: on disk now, and a moment for gloo. In torch
        2.13 freeing it joins gloo's threads while holding the GIL, and a thread still releasing a
        tensor of the last collective needs the GIL: the process hangs (pytorch/pytorch#190489). The
        pause lets that thread finish first; this watcher's own thread makes the race likelier."""
        rec.add("ddp_freed")
        rec.flush()
        time.sleep(0.1)

    def ddp_init(original):
        def ddp_init(self, module, *args, **kwargs):
            original(self, module, *args, **kwargs)
            import weakref

            live_ddp.append(weakref.ref(self, ddp_freed))
            weights.extend(self.module.parameters())
            inner = getattr(module, "_orig_mod", module)
            rec.add(
                "ddp",
                at=where(),
                module=type(inner).__name__,
                compiled=getattr(module, "_compiled_call_impl", None) is not None,
                compiled_inside=hasattr(module, "_orig_mod"),
                device_ids=[str(d) for d in (self.device_ids or [])],
                find_unused_parameters=self.find_unused_parameters,
                devices=sorted({str(p.device) for p in self.module.parameters()}),
                parameters=sum(p.numel() for p in self.module.parameters()),
            )

        return ddp_init

    wrap(DistributedDataParallel, "__init__", "DDP(...)", ddp_init)

    def ddp_forward(original):
        def ddp_forward(self, *args, **kwargs):
            if not torch.is_grad_enabled():
                state["evaluations"] += 1  # a forward without gradients: evaluation, or inference
            else:
                state["forward"] += 1
                first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
                if first is not None and first.numel():
                    flat = first.detach().reshape(-1)
                    sample = flat[:: max(1, flat.numel() // 1024)][:1024].double()
                    inputs.append((sample * torch.arange(1, len(sample) + 1, device=sample.device)).sum())
            return original(self, *args, **kwargs)

        return ddp_forward

    wrap(DistributedDataParallel, "forward", "DDP forward", ddp_forward, compiled_through=True)

    def backward(original):
        def autograd_backward(*args, **kwargs):
            models = [m for m in (ref() for ref in live_ddp) if m is not None]
            state["backward"] += 1
            state["synced"] += any(m.require_backward_grad_sync for m in models)
            if state["pass"] is not None:
                state["pass"]["backward"] += 1
            return original(*args, **kwargs)

        return autograd_backward

    wrap(torch.autograd, "backward", "backward()", backward)

    def after_step(optimizer, args, kwargs):
        if not weights:
            weights.extend(p for group in optimizer.param_groups for p in group["params"])
        state["step"] += 1
        current = state["pass"]
        rec.add(
            "step",
            n=state["step"],
            backward=state["backward"],
            synced=state["synced"],
            forward=state["forward"],
            items=state["items"],
            loader=current and current["loader"],
        )
        state.update(backward=0, synced=0, forward=0, items={})

    register_optimizer_step_post_hook(after_step)

    def item(original):
        def tensor_item(self):
            if called_by_user():
                at = where()
                state["items"][at] = state["items"].get(at, 0) + 1
            return original(self)

        return tensor_item

    wrap(torch.Tensor, "item", ".item()", item)

    def compile_watch(how):
        def make(original):
            def watched_compile(*args, **kwargs):
                target = args[0] if args else kwargs.get("model")
                if called_by_user():
                    rec.add(
                        "compile",
                        how=how,
                        at=where(),
                        wraps_ddp=isinstance(target, DistributedDataParallel),
                        target=type(target).__name__,
                    )
                return original(*args, **kwargs)

            return watched_compile

        return make

    wrap(torch, "compile", "torch.compile()", compile_watch("torch.compile"))
    wrap(torch.nn.Module, "compile", "Module.compile()", compile_watch("Module.compile"))

    # DDP step 6: checkpoints saved and loaded, and every file written
    def save(original):
        def torch_save(obj, f, *args, **kwargs):
            if called_by_user():
                path = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
                rec.add(
                    "save", path=path and os.path.abspath(path), at=where(), what=describe_checkpoint(obj)
                )
            return original(obj, f, *args, **kwargs)

        return torch_save

    wrap(torch, "save", "torch.save()", save)

    def load(original):
        def torch_load(f, *args, **kwargs):
            if called_by_user():
                path = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
                rec.add(
                    "load",
                    path=path and os.path.abspath(path),
                    at=where(),
                    weights_only=kwargs.get("weights_only"),
                    map_location="map_location" in kwargs or len(args) > 0,
                )
            return original(f, *args, **kwargs)

        return torch_load

    wrap(torch, "load", "torch.load()", load)

    written = set()

    def audit(event, args):
        if not rec.enabled or event not in ("open", "os.rename", "os.replace"):
            return
        if event == "open":
            path, mode, flags = args
            if not isinstance(path, (str, bytes)) or not (
                (isinstance(mode, str) and set(mode) & set("wax+")) or (mode is None and flags & 0o3)
            ):
                return
            target = os.path.realpath(os.fsdecode(path))
        else:
            target = os.path.realpath(os.fsdecode(args[1]))
        if target.startswith((folder, "/dev/", "/proc/", "/sys/", caches, *LIBRARY_DIRS)) or re.search(
            r"torchinductor|triton|__pycache__", target
        ):
            return  # not the script's files: this tool's, the system's, torch's caches
        at = where(skip=1)
        if (target, at, event) not in written:
            written.add((target, at, event))
            source = os.path.realpath(os.fsdecode(args[0])) if event != "open" else None
            rec.add("write", path=target, at=at, how=event, source=source)

    sys.addaudithook(audit)

    # DDP step 8: a script that starts its own processes
    import torch.multiprocessing

    def spawn(original):
        def multiprocessing_spawn(*args, **kwargs):
            rec.add("spawn", at=where())
            rec.flush()
            raise SystemExit(
                "check_ddp: this script starts its own processes (torch.multiprocessing.spawn); "
                "under torchrun, each process is already one of the job's"
            )

        return multiprocessing_spawn

    wrap(torch.multiprocessing, "spawn", "mp.spawn()", spawn)
    wrap(torch.multiprocessing, "start_processes", "mp.start_processes()", spawn)

    # a crash: the script's own error, where it was raised, and in which watched call
    previous_hook = sys.excepthook

    def excepthook(kind, error, tb):
        import traceback

        frames = traceback.extract_tb(tb)
        users = [f for f in frames if is_users(f.filename)]
        call, walk = None, tb
        while walk is not None:
            call = WATCHED.get(walk.tb_frame.f_code, call)
            walk = walk.tb_next
        rec.add(
            "crash",
            type=kind.__name__,
            message=str(error).strip()[:400],
            at=f"{os.path.relpath(users[-1].filename)}:{users[-1].lineno}" if users else None,
            call=call,
            loader=state["pass"] and state["pass"]["loader"],
        )
        rec.flush()
        previous_hook(kind, error, tb)

    sys.excepthook = excepthook

    def at_exit():
        values = {}
        if weights:
            with torch.no_grad():
                flat = [p.detach().double().reshape(-1) for p in weights]
                values = {
                    "sum": sum(float(p.sum()) for p in flat),
                    "squares": sum(float((p * p).sum()) for p in flat),
                    "count": sum(p.numel() for p in flat),
                }
        graphs = None
        if "torch._dynamo" in sys.modules:
            graphs = sys.modules["torch._dynamo"].utils.counters["stats"]["unique_graphs"]
        rec.add(
            "exit",
            weights=values,
            inputs=[float(x) for x in torch.stack(inputs).tolist()] if inputs else [],
            graphs=graphs,
            steps=state["step"],
            evaluations=state["evaluations"],
        )
        rec.flush()

    import atexit

    atexit.register(at_exit)
    rec.flush()


def describe_checkpoint(obj):
    """What a saved object holds: model state dicts (and their key prefixes), optimizer state."""
    import torch

    found = {"models": 0, "module_prefix": 0, "orig_mod_prefix": 0, "optimizer": False, "module": None}

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


# -----------------------------------------------------------------------------
# what the records say: one verdict per step, from what the job did


class Line:
    """One step's verdict (ok, warn, FAIL, or -- for not checked), what it rests on, what to do."""

    def __init__(self, step, verdict, message, help=None, see=None):
        self.step, self.verdict, self.message, self.help, self.see = step, verdict, message, help, see


def code(at):
    """The source line at file:line, short, in backquotes: the evidence a reader recognises."""
    if not at:
        return ""
    path, _, line = at.rpartition(":")
    try:
        text = Path(path).read_text().splitlines()[int(line) - 1].strip()
    except (OSError, ValueError, IndexError):
        return at
    return f"{at} `{text if len(text) <= 70 else text[:67] + '...'}`"


def ranks_text(ranks):
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def both(ranks):
    return "both" if len(ranks) == 2 else "all"


def by_line(at):
    path, _, line = at.rpartition(":")
    return path, int(line) if line.isdigit() else 0


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "s")


def judge(job):
    world = max((e["world_size"] for _, e in job.records("start")), default=0)
    crash = first_crash(job)
    lines = [
        step_1(job, crash),
        step_2(job, crash),
        step_3(job, world),
        step_4(job, world, crash),
        step_5(job, world, crash),
        step_6(job),
        step_7(job, crash),
        step_8(job, crash),
        step_9(job),
        step_10(job, world, crash),
    ]
    lines = [line for line in lines if line is not None]
    if crash is not None and not any(getattr(line, "explains_crash", False) for line in lines):
        rank, event = crash
        step = crash_step(job, event)
        error = f"{event['type']}: {short(event['message'])}"
        lines = [line for line in lines if line.step != step]
        lines.append(
            Line(
                step,
                "FAIL",
                f"rank {rank} stopped with an error at {code(event['at'])}: {error}",
                help="the script's own error; torchrun then stopped every rank. Its traceback is in the "
                "job's output (below)",
            )
        )
    return sorted(lines, key=lambda line: line.step)


def first_crash(job):
    """The crash that explains the others: a rank's own error before one that only reports a lost
    peer (torchrun stops the other ranks when one fails, and they may fail on its absence first)."""
    crashes = job.records("crash")
    return min(crashes, key=lambda c: (bool(COMMUNICATION_ERROR.search(c[1]["message"])), c[0]), default=None)


def crash_step(job, event):
    """The step a rank was in when it failed: the watched call it was in, or how far it got."""
    by_call = {
        "init_process_group()": 1,
        "DataLoader(...)": 3,
        "iter(DataLoader)": 3,
        "next(DataLoader)": 3,
        "sampler.set_epoch()": 3,
        "DDP(...)": 4,
        "DDP forward": 4,
        "backward()": 4,
        "torch.save()": 6,
        "torch.load()": 6,
        "destroy_process_group()": 7,
    }
    loaders = loader_passes(job)
    if event.get("loader") in loaders and not loaders[event["loader"]]["training"]:
        return 10  # in an evaluation loop
    if event.get("call") in by_call:
        return by_call[event["call"]]
    if (event.get("call") or "").startswith("dist."):
        return 5
    if not job.records("met"):
        return 1
    return 5 if job.records("ddp") else 3


def short(message):
    """An error's first sentence, without the C++ source locations torch puts in front."""
    message = re.sub(r"\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*", "", message or "").strip()
    first = message.splitlines()[0] if message else ""
    return first if len(first) <= 160 else first[:157] + "..."


def needs_gpu(event):
    return bool(
        event
        and re.search(r"CUDA|NVIDIA|NCCL|nccl|cuda|GPU", event["message"])
        and "SyncBatchNorm" not in event["message"]
        and not re.search(r"out of memory", event["message"])
    )


def still_waiting(job):
    """Each rank's last known position: (the watched call it was in, the script's line, and the
    script's lines that led there, innermost first)."""
    found = {}
    for rank, event in job.records("now"):
        stack = event["stack"]
        found[rank] = (event["call"], stack[0] if stack else None, stack)
    return found


def step_1(job, crash):
    writes = [(r, e) for r, e in job.records("env") if e["key"] in ("MASTER_ADDR", "MASTER_PORT")]
    inits, met = job.records("init"), job.records("met")
    waiting = sorted(r for r, call in still_waiting(job).items() if call[0] == "init_process_group()")
    never_met = job.hung and waiting and len(met) < len(job.ranks)
    if writes:
        rank, e = next(((r, e) for r, e in writes if e["key"] == "MASTER_PORT"), writes[0])
        text = f"{code(e['at'])} sets {e['key']}={e['value']}, over torchrun's {e['torchrun']}"
        if never_met:
            text += (
                f": the ranks never met ({ranks_text(waiting)} waited in init_process_group() "
                f"until stopped after {job.options.silence:g} s without progress)"
            )
        line = Line(
            1,
            "FAIL",
            text,
            help="delete it: torchrun sets MASTER_ADDR and MASTER_PORT (and RANK, LOCAL_RANK, WORLD_SIZE), "
            "and init_process_group() reads them",
            see=PITFALLS["master_port"],
        )
        line.explains_hang = never_met
        line.explains_crash = True  # the ranks that did meet met someone else's job, or no one
        return line
    for _rank, e in job.records("env"):
        return Line(
            1,
            "FAIL",
            f"{code(e['at'])} sets {e['key']}={e['value']}, over torchrun's {e['torchrun']}",
            help="read RANK, LOCAL_RANK and WORLD_SIZE from the environment torchrun made; never write them",
        )
    if not inits:
        if crash and "process group has not been initialized" in crash[1]["message"]:
            line = Line(
                1,
                "FAIL",
                f"no rank called dist.init_process_group(), and {code(crash[1]['at'])} needs the group",
                help="call dist.init_process_group(backend) first, in every process",
            )
            line.explains_crash = True
            return line
        if not job.ranks:
            return Line(1, "--", "not checked: the script never started (step 8)")
        if (crash or job.records("spawn") or job.hung or job.returncode) and not job.records("step"):
            return Line(1, "--", "not checked: the job stopped before any rank made its process group")
        return Line(
            1,
            "FAIL",
            f"no rank called dist.init_process_group(): each of the {len(job.ranks)} processes trained alone",
            help="call dist.init_process_group(backend) first, in every process",
        )
    rank, e = inits[0]
    if e["init_method"] not in (None, "env://"):
        return Line(
            1,
            "FAIL",
            f"{code(e['at'])} passes init_method={e['init_method']!r}: not where torchrun's job meets",
            help="pass no init_method: the default, env://, reads where torchrun's job meets",
            see=PITFALLS["master_port"],
        )
    for r, e in inits:
        env = next((s["env"] for rr, s in job.records("start") if rr == r), {})
        for key in ("rank", "world_size"):
            value = e[key]
            if value not in (None, -1) and str(value) != env.get(key.upper()):
                return Line(
                    1,
                    "FAIL",
                    f"{code(e['at'])} passes {key}={value} on rank {r}, but torchrun made it "
                    f"{key.upper()}={env.get(key.upper())}",
                    help=f"leave {key}= out: init_process_group() reads {key.upper()} from torchrun",
                )
    if never_met:
        line = Line(
            1,
            "FAIL",
            f"the ranks never met: {ranks_text(waiting)} waited in init_process_group() at {code(e['at'])} "
            f"until stopped after {job.options.silence:g} s without progress",
            help="every process of the job must call init_process_group() with what torchrun set",
        )
        line.explains_hang = True
        return line
    if len(met) < len(job.ranks) or not met:
        return Line(1, "--", "not checked: the job stopped before every rank had joined the group")
    seconds = max(m["seconds"] for _, m in met)
    return Line(1, "ok", f"{len(met)} ranks met ({met[0][1]['backend']}) at {e['at']}, in {seconds:.1f} s")


def step_2(job, crash):
    if crash and "invalid device ordinal" in crash[1]["message"]:
        line = Line(
            2,
            "FAIL",
            f"rank {crash[0]} asked for a GPU its node lacks at {code(crash[1]['at'])}",
            help="use LOCAL_RANK, the process's number on its node, as the GPU index, not RANK",
            see=PITFALLS["global_rank_device"],
        )
        line.explains_crash = True
        return line
    if job.device != "cuda":
        return Line(2, "--", "not checked: no GPU here")
    starts = {r: e for r, e in job.records("start")}
    devices = {r: e["devices"] for r, e in job.records("ddp")}
    if not devices:
        return Line(2, "--", "not checked: no model was wrapped in DDP")
    wrong = {r: d for r, d in devices.items() if d != [f"cuda:{starts[r]['local_rank']}"]}
    if wrong:
        r, d = sorted(wrong.items())[0]
        return Line(
            2,
            "FAIL",
            f"rank {r} (LOCAL_RANK {starts[r]['local_rank']}) has its model on {', '.join(d)}",
            help="torch.cuda.set_device(local_rank) and model.to(f'cuda:{local_rank}'), from LOCAL_RANK",
            see=PITFALLS["global_rank_device"],
        )
    return Line(
        2,
        "ok",
        "each rank's model is on the GPU of its LOCAL_RANK: "
        + ", ".join(f"rank {r} on {d[0]}" for r, d in sorted(devices.items())),
    )


def loader_passes(job):
    """For each loader (by id): its records per rank, its passes' indices per rank, and whether
    optimizer steps ran on its batches (a training loader) or none did (an evaluation loader)."""
    loaders = {}
    for rank, events in job.ranks.items():
        current = {}
        for e in events:
            if e["e"] == "loader":
                loaders.setdefault(e["id"], {"made": {}, "passes": {}, "data": {}, "training": False})
                loaders[e["id"]]["made"][rank] = e
            elif e["e"] == "pass" and e["loader"] in loaders:
                passes = loaders[e["loader"]]["passes"].setdefault(rank, [])
                passes.append([])
                current[e["loader"]] = passes[-1]
            elif e["e"] == "batch" and e["loader"] in current:
                if "idx" in e:
                    current[e["loader"]].extend(e["idx"])
                else:
                    loaders[e["loader"]]["data"].setdefault(rank, []).append(e["data"])
            elif e["e"] == "step" and e.get("loader") in loaders:
                loaders[e["loader"]]["training"] = True
    return loaders


def step_3(job, world):
    loaders = loader_passes(job)
    training = {i: loader for i, loader in loaders.items() if loader["training"]}
    if not training:
        inputs = {r: e["inputs"] for r, e in job.records("exit") if e["inputs"]}
        if len(inputs) == world > 1:
            n = min(map(len, inputs.values()))
            same = sum(len({tuple(v[:n]) for v in inputs.values()}) == 1 for _ in [0])
            if same and n:
                return Line(
                    3,
                    "FAIL",
                    f"every rank trained on the very same batches ({n} steps compared; the script draws its "
                    "batches without a DataLoader)",
                    help="give each rank its own part of the data: a DistributedSampler, or batches drawn "
                    "from a generator seeded by rank",
                    see=PITFALLS["unseeded"],
                )
            return Line(
                3,
                "--",
                "not checked whether the shards cover the data: the script draws its batches "
                "without a DataLoader (its ranks' batches do differ)",
            )
        return Line(3, "--", "not checked: no DataLoader gave batches to training")
    found = []
    for _i, loader in training.items():
        made = loader["made"]
        some = next(iter(made.values()))
        at, length, distributed = some["at"], some["length"], some["distributed"]
        data = {r: e["data"] for r, e in made.items()}
        if len(set(data.values())) > 1 and None not in data.values():
            differing = sorted(data)
            message = (
                f"the ranks built different datasets: the data of the DataLoader at {code(at)} differs "
                f"between {ranks_text(differing)}"
            )
            if distributed:
                return Line(
                    3,
                    "FAIL",
                    message + ", and DistributedSampler assumes it is the same on every rank",
                    help="seed the data the same on every rank (torch.Generator().manual_seed(seed)), or "
                    "build it on one rank and share it",
                    see=PITFALLS["unseeded"],
                )
            found.append(
                Line(
                    3,
                    "warn",
                    message + " (fine if each rank loads its own shard on purpose)",
                    help="if the data is random, seed it the same on every rank",
                    see=PITFALLS["unseeded"],
                )
            )
        passes = loader["passes"]
        if len(passes) < 2:
            continue
        common = min(len(p) for p in passes.values())
        for n in range(common):
            shards = {r: p[n] for r, p in passes.items()}
            sets = {r: set(s) for r, s in shards.items()}
            ranks = sorted(sets)
            shared = max(len(sets[a] & sets[b]) for a in ranks for b in ranks if a < b)
            if shared > world - 1:  # more than DistributedSampler's padding can repeat
                if all(sets[r] == sets[ranks[0]] for r in ranks) and length and len(sets[ranks[0]]) >= length:
                    what = f"{ranks_text(ranks)} each drew all {length} samples in epoch {n + 1}"
                else:
                    what = (
                        f"in epoch {n + 1} the shards of {ranks_text(ranks)} share {shared} of their "
                        f"{min(len(s) for s in sets.values())} samples"
                    )
                if distributed and (
                    distributed["num_replicas"] != world
                    or len({made[r]["distributed"]["rank"] for r in made}) < len(made)
                ):
                    fix = "leave num_replicas= and rank= out of DistributedSampler(...): the group knows them"
                else:
                    fix = (
                        "pass sampler=DistributedSampler(dataset) to the DataLoader, and drop shuffle=True "
                        "(the sampler shuffles); call sampler.set_epoch(epoch) each epoch"
                    )
                return Line(
                    3,
                    "FAIL",
                    f"{what} (DataLoader at {code(at)}): each rank trains on the same data",
                    help=fix,
                    see=PITFALLS["set_epoch"],
                )
        # whole passes only: a script may peek at one batch (next(iter(loader))) to learn its size
        longest = max(len(p) for p in passes[min(passes)])
        orders = [p for p in passes[min(passes)] if len(p) >= longest / 2]
        if len(orders) >= 2 and orders[0] != sorted(orders[0]) and all(o == orders[0] for o in orders[1:]):
            set_epochs = [e for _, e in job.records("set_epoch")]
            told = f" (set_epoch always got {set_epochs[0]['epoch']})" if set_epochs else ""
            return Line(
                3,
                "FAIL",
                f"rank {min(passes)} drew the same order in each of its {len(orders)} epochs{told}: "
                f"the shuffle happens once per job (DataLoader at {code(at)})",
                help="call sampler.set_epoch(epoch) at the start of each epoch, on every rank",
                see=PITFALLS["set_epoch"],
            )
        per_rank = longest
        how = "DistributedSampler" if distributed else some["sampler"]
        detail = f"{how}: disjoint shards of {per_rank} samples a rank"
        if length:
            detail += f", of {length}"
        if len(orders) >= 2:
            detail += ", a new order each epoch" if orders[0] != orders[1] else ""
        else:
            detail += " (one epoch: set_epoch not checked)"
        found.append(Line(3, "ok", f"{detail} (DataLoader at {at})"))
    order = {"FAIL": 0, "warn": 1, "ok": 2}
    return sorted(found, key=lambda line: order[line.verdict])[0] if found else Line(3, "--", "not checked")


def weights_differ(job):
    weights = {r: e["weights"] for r, e in job.records("exit") if e["weights"]}
    if len(weights) < 2:
        return None
    ranks = sorted(weights)
    base = weights[ranks[0]]
    for r in ranks[1:]:
        for key in ("sum", "squares"):
            a, b = base[key], weights[r][key]
            if abs(a - b) > 1e-6 * max(1.0, abs(a), abs(b)):
                ours, theirs = base["sum"], weights[r]["sum"]
                return f"rank {ranks[0]}'s weights sum to {ours:.6g}, rank {r}'s to {theirs:.6g}"
    return ""


def step_4(job, world, crash):
    if crash and "Expected to have finished reduction" in crash[1]["message"]:
        line = Line(
            4,
            "FAIL",
            f"rank {crash[0]}: a parameter got no gradient in the last step, so DDP's all-reduce never "
            f"finished ({code(crash[1]['at'])}): a parameter forward() does not use",
            help="remove the parameter, or pass find_unused_parameters=True to DDP (slower)",
            see=PITFALLS["unused_parameter"],
        )
        line.explains_crash = True
        return line
    if crash and "SyncBatchNorm" in crash[1]["message"]:
        line = Line(
            4,
            "FAIL",
            f"rank {crash[0]}: {code(crash[1]['at'])}: {short(crash[1]['message'])}",
            help="convert to SyncBatchNorm only where the model is on GPUs: "
            "if device.type == 'cuda': model = nn.SyncBatchNorm.convert_sync_batchnorm(model)",
        )
        line.explains_crash = True
        return line
    ddp, steps = job.records("ddp"), job.records("step")
    if not steps:
        return Line(4, "--", "not checked: no optimizer step ran")
    differ = weights_differ(job)
    if not ddp:
        return Line(
            4,
            "FAIL",
            "no rank wrapped its model in DDP: the ranks train apart, each its own replica"
            + (f", and end apart: {differ}" if differ else ""),
            help="model = DDP(model, device_ids=[local_rank]) (no device_ids on a CPU), after moving it to "
            "its device",
        )
    at = ddp[0][1]["at"]
    if sum(e["forward"] for _, e in steps) == 0:
        return Line(
            4,
            "FAIL",
            f"the model is wrapped at {code(at)}, but training never calls the wrapper: no forward went "
            "through DDP, so no gradient was all-reduced" + (f" ({differ})" if differ else ""),
            help="call the DDP model (ddp_model(x)) in training, not the model it wraps",
        )
    if differ:
        return Line(
            4,
            "FAIL",
            f"the replicas differ at the end: {differ} (DDP at {code(at)})",
            help="every rank must take the same optimizer steps on the DDP model's all-reduced gradients",
        )
    if "did not find any unused parameters" in job.output:  # DDP's own warning, in the job's output
        return Line(
            4,
            "warn",
            f"DDP(..., find_unused_parameters=True) at {code(at)}, and every parameter is used: DDP walks "
            "the autograd graph after every forward for nothing",
            help="leave find_unused_parameters out (it is False by default)",
            see=PITFALLS["unused_parameter"],
        )
    compiles = [e for _, e in job.records("compile") if e["wraps_ddp"]]
    compiled_before = [e for _, e in ddp if e["compiled"]]
    graphs = max((e["graphs"] or 0 for _, e in job.records("exit")), default=0)
    if (compiles or compiled_before) and not graphs:
        e = compiles[0] if compiles else compiled_before[0]
        how = "torch.compile(DDP(model))" if compiles else "model.compile() before DDP(model)"
        return Line(
            4,
            "warn",
            f"{how} at {code(e['at'])} compiled nothing (torch's compiler captured 0 graphs)",
            help="compile the bare model, then wrap it: model = DDP(torch.compile(model))",
            see=PITFALLS["compile_order"],
        )
    total = max(e["steps"] for _, e in job.records("exit")) if job.records("exit") else None
    equal = "the replicas are equal at the end" if differ == "" else "every forward went through it"
    return Line(4, "ok", f"DDP at {at}; {equal}" + (f" ({plural(total, 'step')})" if total else ""))


def step_5(job, world, crash):
    if (
        job.hung
        and job.records("met")
        and not any(getattr(line, "explains_hang", False) for line in [step_1(job, None)])
    ):
        return hang_line(job)
    why = divergence(job)
    if crash and COMMUNICATION_ERROR.search(crash[1]["message"]) and why:
        line = Line(
            5,
            "FAIL",
            f"rank {crash[0]} lost its peers at {code(crash[1]['at'])} ({short(crash[1]['message'])}). "
            + why[0],
            help=why[1],
            see=why[2],
        )
        line.explains_crash = True
        return line
    steps = job.records("step", rank=min(job.ranks)) if job.ranks else []
    colls = job.records("coll", rank=min(job.ranks)) if job.ranks else []
    if not steps:
        return Line(5, "--", "not checked: no optimizer step ran")
    n = len(steps)
    every_step = []
    sites = {}
    for _, e in colls:
        sites.setdefault((e["name"], e["at"]), set()).add(e["step"])
    for (name, at), at_steps in sites.items():
        if n >= 8 and len(at_steps) >= 0.9 * n and name in ("all_reduce", "reduce", "all_gather", "barrier"):
            every_step.append(f"dist.{name}() at {code(at)}")
    items = {}
    for _, e in steps:
        for at in e["items"]:
            items[at] = items.get(at, 0) + 1
    for at, count in items.items():
        if n >= 8 and count >= 0.9 * n:
            every_step.append(f".item() at {code(at)}")
    if every_step:
        return Line(
            5,
            "warn",
            f"a host sync at every one of {n} steps, for logging: {'; '.join(every_step)}",
            help="on a GPU each waits for the GPU to finish; sum (loss x samples, samples) on the device "
            "and all-reduce it once an epoch",
            see=PITFALLS["metrics"],
        )
    reduced = sorted({at for (name, at) in sites if name in REDUCING}, key=by_line)
    if world > 1 and not reduced:
        return Line(
            5,
            "warn",
            "no metric is all-reduced: what rank 0 reports is its own shard's",
            help="sum (loss x samples, samples) on each rank, then dist.all_reduce() it, once an epoch",
            see=PITFALLS["metrics"],
        )
    calls = sum(1 for _, e in colls if e["at"] in reduced)
    return Line(
        5,
        "ok",
        f"all-reduced at {' and '.join(reduced)}: {plural(calls, 'call')} in {plural(n, 'step')}",
    )


def hang_line(job):
    """A job that stopped making progress after its ranks met: where each rank waits, and why."""
    waiting = still_waiting(job)
    parts = []
    for rank in sorted(job.ranks):
        call, at, _ = waiting.get(rank, (None, None, []))
        what = call or "its own code"
        if call == "backward()" and job.records("ddp"):
            what = "backward(), DDP's gradient all-reduce"
        parts.append(f"rank {rank} waits in {what} at {code(at)}" if at else f"rank {rank}: not known")
    text = f"the job stopped making progress ({job.options.silence:g} s without any): " + "; ".join(parts)
    cause, help, see = divergence(job, waiting) or (
        None,
        "every rank must reach the same collectives, in the same order",
        PITFALLS["rank_zero_collective"],
    )
    return Line(5, "FAIL", text + (f". {cause}" if cause else ""), help=help, see=see)


COMMUNICATION_ERROR = re.compile(
    r"closed by peer|reset by peer|Connection refused|Timed out|timed out|doesn't match expected size|"
    r"collective mismatch|Broken pipe|NCCL communicator was aborted|Watchdog caught"
)


def divergence(job, waiting=None):
    """Why the ranks fell out of step, seen from what each did: (cause, help, pitfall), or None."""
    for _, (call, at, stack) in sorted((waiting or {}).items()):
        for line in stack if call and call != "backward()" else ():
            condition = rank_condition(line)
            if condition:
                reached = f"{call} at {at}" + (f", called from {line}," if line != at else "")
                return (
                    f"{reached} is inside `{condition}`: only some ranks reach it",
                    "take the collective out of the rank-only block: every rank must call it",
                    PITFALLS["rank_zero_collective"],
                )
    if not job.records("join"):
        for loader in loader_passes(job).values():
            batches = {r: e["batches"] for r, e in loader["made"].items() if e["batches"] is not None}
            if loader["training"] and len(set(batches.values())) > 1:
                return (
                    "the ranks have different numbers of batches an epoch ("
                    + ", ".join(f"rank {r}: {n}" for r, n in sorted(batches.items()))
                    + f", DataLoader at {next(iter(loader['made'].values()))['at']}): uneven inputs, and "
                    "every backward() all-reduces with every rank",
                    "give every rank as many batches: DistributedSampler (it pads, or drops with "
                    "drop_last=True), or run the loop inside torch.distributed.algorithms.join.Join([model])",
                    PITFALLS["uneven"],
                )
    steps = {r: len([e for e in events if e["e"] == "step"]) for r, events in job.ranks.items()}
    if len(set(steps.values())) > 1:
        return (
            "the ranks left the training loop at different steps ("
            + ", ".join(f"rank {r}: {c}" for r, c in sorted(steps.items()))
            + ")",
            "decide to stop from values every rank has (all-reduce the metric first), so that all stop "
            "together",
            PITFALLS["early_stop"],
        )
    return None


def rank_condition(at):
    """The `if` around file:line that tests a rank (if rank == 0:, if master_process:), if any."""
    if not at:
        return None
    path, _, line = at.rpartition(":")
    try:
        source = Path(path).read_text()
        tree = ast.parse(source)
    except (OSError, SyntaxError):
        return None
    line = int(line)
    found = None
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and node.lineno < line <= (node.end_lineno or 0):
            inside = any(child.lineno <= line <= (child.end_lineno or 0) for child in node.body)
            test = ast.get_source_segment(source, node.test) or ""
            if inside and re.search(r"rank|master|main_process|is_main|leader", test, re.I):
                if found is None or node.lineno > found[0]:
                    found = (node.lineno, f"if {test}:")
    return found and found[1]


def step_6(job):
    renamed = {}
    for _, e in job.records("write"):
        if e["how"] != "open" and e["source"]:
            renamed[e["source"]] = e["path"]
    saves = [(r, e) for r, e in job.records("save")]
    for _, e in job.records("load"):
        if e["weights_only"] is False:
            return Line(
                6,
                "FAIL",
                f"{code(e['at'])} loads with weights_only=False: loading such a file runs any code it names",
                help="save plain tensors and numbers, and load with weights_only=True (the default since "
                "torch 2.6)",
                see=PITFALLS["unsafe_load"],
            )
    by_path = {}
    for rank, e in saves:
        path = renamed.get(e["path"], e["path"])
        by_path.setdefault(path, {})[rank] = e
    for path, savers in sorted(by_path.items()):
        if path and len(savers) > 1:
            e = next(iter(savers.values()))
            return Line(
                6,
                "FAIL",
                f"{ranks_text(savers)} {both(savers)} saved {os.path.relpath(path)} at {code(e['at'])}: "
                "every rank writes the same file, at once",
                help="save on one rank: if dist.get_rank() == 0: torch.save(...), with no collective inside",
                see=PITFALLS["rank_zero_collective"],
            )
    if not saves:
        return shared_writes(job) or Line(6, "--", "not checked: the script saved nothing with torch.save()")
    for _, e in saves:
        what = e["what"]
        if what["module_prefix"]:
            return Line(
                6,
                "FAIL",
                f"the model keys saved at {code(e['at'])} start with module.: the state_dict() of the DDP "
                "wrapper, which only a DDP model loads",
                help="save model.module.state_dict(), the model DDP wraps",
                see=PITFALLS["wrapped_state_dict"],
            )
        if what["module"] == "DistributedDataParallel":
            return Line(
                6,
                "FAIL",
                f"{code(e['at'])} pickles the DDP wrapper itself",
                help="save model.module.state_dict()",
                see=PITFALLS["wrapped_state_dict"],
            )
    ranks = sorted({r for r, _ in saves})
    e = saves[0][1]
    shared = shared_writes(job)
    if shared:
        return shared
    if any(s["what"]["orig_mod_prefix"] for _, s in saves):
        return Line(
            6,
            "warn",
            f"the model keys saved at {code(e['at'])} start with _orig_mod.: a compiled model's, which only "
            "a compiled model loads",
            help="save the bare model's state_dict(): keep a reference to it before torch.compile",
            see=PITFALLS["compile_order"],
        )
    if not any(s["what"]["optimizer"] for _, s in saves):
        return Line(
            6,
            "warn",
            f"the checkpoint saved at {code(e['at'])} holds no optimizer state: training cannot resume "
            "exactly from it",
            help="save optimizer.state_dict() too (and the epoch), and load both to resume",
        )
    names = sorted({os.path.basename(renamed.get(s["path"], s["path"]) or "?") for _, s in saves})
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    return Line(
        6,
        "ok",
        f"{ranks_text(ranks)} alone saved {shown} at {e['at']}: model and optimizer state, no module. prefix",
    )


def shared_writes(job):
    """A file, other than a checkpoint, that more than one rank wrote."""
    writers = {}
    for rank, e in job.records("write"):
        writers.setdefault(e["path"], {})[rank] = e
    for path, by in sorted(writers.items()):
        if len(by) > 1 and not path.endswith(".lock"):
            e = next(iter(by.values()))
            return Line(
                6,
                "warn",
                f"{ranks_text(by)} {both(by)} wrote {os.path.relpath(path)} at {code(e['at'])}",
                help="write files from one rank (if dist.get_rank() == 0:), or one file per rank",
            )
    return None


def step_7(job, crash):
    destroyed = {r: e for r, e in job.records("destroy")}
    if job.stuck_at_exit:
        ended = {r for r, _ in job.records("exit")}
        stuck = sorted(set(job.ranks) - ended) or sorted(job.ranks)
        freeing = all(job.records("ddp_freed", rank=r) for r in stuck)
        return Line(
            7,
            "warn",
            f"every rank finished training, but {ranks_text(stuck)} did not end: stopped "
            f"{job.options.silence + 10:g} s after the last sign of life"
            + (", while freeing the DDP model" if freeing else ""),
            help="on gloo, torch 2.13 can hang as a process frees its DDP model (pytorch/pytorch#190489); "
            "else something still runs as Python exits (a thread, a worker pool): end it",
        )
    if len(destroyed) == len(job.ranks) and destroyed:
        return Line(
            7, "ok", f"every rank destroyed its process group at {next(iter(destroyed.values()))['at']}"
        )
    if job.hung or crash or job.returncode:
        return Line(7, "--", "not checked: the job did not finish")
    if not job.records("met"):
        return Line(7, "--", "not checked: no process group was made")
    missing = sorted(set(job.ranks) - set(destroyed))
    return Line(
        7,
        "warn",
        f"{ranks_text(missing) if destroyed else 'no rank'} called dist.destroy_process_group() at the end",
        help="call dist.destroy_process_group() once training is done, on every rank",
    )


def step_8(job, crash):
    spawns = job.records("spawn")
    if spawns:
        line = Line(
            8,
            "FAIL",
            f"{code(spawns[0][1]['at'])} starts its own processes: under torchrun each of the "
            f"{len(job.ranks)} processes is already one of the job's, and would start a job of its own",
            help="drop mp.spawn: run the training function once, reading RANK, LOCAL_RANK and WORLD_SIZE "
            "from "
            "the environment torchrun makes; launch with torchrun",
            see=PITFALLS["notebook"],
        )
        line.explains_crash = True
        return line
    if job.device == "cpu":
        for _, e in job.records("init"):
            if "nccl" in e["backend"].lower():
                line = Line(
                    8,
                    "FAIL",
                    f"{code(e['at'])} needs a GPU (nccl), and this machine has none",
                    help='pick the backend from the device: "nccl" if torch.cuda.is_available() else "gloo"',
                )
                line.explains_crash = True
                return line
        if crash and needs_gpu(crash[1]):
            line = Line(
                8,
                "FAIL",
                f"{code(crash[1]['at'])} needs a GPU, and this machine has none: "
                f"{crash[1]['type']}: {short(crash[1]['message'])}",
                help="choose the device from what there is: torch.device('cuda', local_rank) if "
                "torch.cuda.is_available() else torch.device('cpu'), and gloo on a CPU",
            )
            line.explains_crash = True
            return line
    quit_early = job.returncode and not (crash or job.hung or job.stuck_at_exit or job.records("step"))
    if not job.ranks or quit_early:
        said = script_said(job) or f"exit {job.returncode}"
        return Line(
            8,
            "FAIL",
            f"the script {'did not start' if not job.ranks else 'stopped before training'} under torchrun: "
            f"{said}",
            help="give the script its own arguments after its name (python check_ddp.py my_train.py ARGS); "
            "torchrun --standalone --nproc_per_node=2 my_train.py ARGS shows the whole error",
        )
    return Line(8, "ok", f"torchrun ran it as written, {len(job.ranks)} processes")


def script_said(job):
    """The last line the script printed before torchrun's own report of its failure."""
    lines = job.output.splitlines()
    end = next(
        (i for i, line in enumerate(lines) if re.search(r"failed \(exitcode|Sending process", line)), None
    )
    lines = [
        line.strip()
        for line in lines[:end]
        if line.strip() and not re.match(r"[WIE]\d{4} |\*{5}|Setting OMP_NUM_THREADS", line)
    ]
    return lines[-1] if lines else ""


def step_9(job):
    steps = [e for _, e in job.records("step") if e["backward"] > 1 and job.records("ddp")]
    if not steps:
        return None
    k = max(e["backward"] for e in steps)
    synced = max(e["synced"] for e in steps)
    if synced > 1:
        return Line(
            9,
            "warn",
            f"{k} backward passes make each optimizer step, and {synced} of them all-reduce their gradients",
            help=f"wrap the first {k - 1} in model.no_sync(): the gradients then add up locally, and only "
            "the "
            "last backward all-reduces them",
            see=PITFALLS["no_sync"],
        )
    return Line(9, "ok", f"{k} micro-batches an optimizer step; only the last backward all-reduces (no_sync)")


REDUCING = ("all_reduce", "reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "gather")


def step_10(job, world, crash):
    loaders = loader_passes(job)
    evaluation = {i: loader for i, loader in loaders.items() if not loader["training"] and loader["passes"]}
    if crash and crash[1].get("loader") in evaluation:
        rank, e = crash
        if e.get("call") == "DDP forward" and COMMUNICATION_ERROR.search(e["message"]):
            line = Line(
                10,
                "FAIL",
                f"rank {rank} evaluated through the DDP model at {code(e['at'])} while the other ranks did "
                f"not: DDP's forward waits for them ({short(e['message'])})",
                help="evaluate the bare model, model.module, under torch.no_grad(): it needs no other rank",
            )
            line.explains_crash = True
            return line
        return None  # the script's own error, in its evaluation: reported as such, in this step
    if not evaluation:
        through_ddp = {r: e["evaluations"] for r, e in job.records("exit")}
        alone = sorted(r for r, n in through_ddp.items() if n)
        if len(through_ddp) == world > 1 and len(alone) == 1:
            return Line(
                10,
                "warn",
                f"rank {alone[0]} alone evaluated ({through_ddp[alone[0]]} forwards without gradients "
                "through the DDP model, none on the other ranks): its held-out number is an estimate from "
                "its own batches, not the held-out set",
                help="for an exact number, let every rank evaluate its shard of the held-out set, then "
                "all-reduce (sum, count)",
            )
        return None
    for i, loader in evaluation.items():
        passes = loader["passes"]
        at = next(iter(loader["made"].values()))["at"]
        if len(passes) < world:
            continue
        shards = {r: p[0] for r, p in passes.items()}
        union = set().union(*map(set, shards.values()))
        total = sum(map(len, shards.values()))
        if all(set(s) == union for s in shards.values()) and world > 1:
            return Line(
                10,
                "ok",
                f"every rank evaluated all {len(union)} held-out samples (DataLoader at {at}): exact, and "
                f"{world} times the work",
            )
        if not reduced_after_passes(job, i):
            return Line(
                10,
                "FAIL",
                f"each rank evaluated only its own shard of the held-out set (DataLoader at {code(at)}), "
                "and no collective followed: the held-out metric each rank has is its shard's alone",
                help="sum (loss x samples, samples) and correct counts on each rank, then dist.all_reduce() "
                "them before dividing",
                see=PITFALLS["metrics"],
            )
        if total > len(union):
            return Line(
                10,
                "warn",
                f"the held-out shards repeat {total - len(union)} of {len(union)} samples (DataLoader at "
                f"{code(at)}): DistributedSampler pads them, so a mean counts those twice",
                help="give rank r the samples range(r, len(dataset), world_size), then all-reduce "
                "(sum, count)",
            )
        return Line(
            10,
            "ok",
            f"each rank evaluated its own shard, then all-reduced: {len(union)} held-out samples, each once "
            f"(DataLoader at {at})",
        )
    return None


def reduced_after_passes(job, loader):
    """Whether, on the lowest rank, a reducing collective follows each pass over loader before the
    next pass over any loader (or the end)."""
    rank = min(job.ranks)
    pending = False
    for e in job.ranks[rank]:
        if e["e"] == "pass":
            if pending:
                return False
            pending = e["loader"] == loader
        elif e["e"] == "coll" and e["name"] in REDUCING:
            pending = False
        elif e["e"] == "exit" and pending:
            return False
    return True


# -----------------------------------------------------------------------------
# the report: a line per step, details only where they help, the verdict last


def report(job, lines):
    width = 100
    out = [
        f"check_ddp: {' '.join(job.command)}  ({len(job.ranks) or job.options.nproc} processes, "
        f"{'GPUs, nccl' if job.device == 'cuda' else 'CPU, gloo'}; {job.seconds:.1f} s)"
    ]
    for line in lines:
        head = f"step {line.step:<2} {line.verdict:<5} "
        out.append(
            textwrap.fill(
                f"{STEPS[line.step]}: {line.message}",
                width,
                initial_indent=head,
                subsequent_indent=" " * len(head),
            )
        )
        if line.help and line.verdict in ("FAIL", "warn"):
            out.append(
                textwrap.fill(
                    line.help,
                    width,
                    initial_indent=" " * len(head) + "help: ",
                    subsequent_indent=" " * (len(head) + 6),
                )
            )
        if line.see and line.verdict in ("FAIL", "warn"):
            out.append(" " * len(head) + f"see:  {line.see}")
    failed = [line.step for line in lines if line.verdict == "FAIL"]
    warned = [line.step for line in lines if line.verdict == "warn"]
    verdict = (
        "FAIL: " + ", ".join(f"step {s}" for s in failed) + " failed" if failed else "ok: no step failed"
    )
    if warned:
        verdict += f" ({plural(len(warned), 'warning')}: " + ", ".join(f"step {s}" for s in warned) + ")"
    out.append(f"check_ddp: {verdict}. The job's own output: {job.folder / 'output.log'}")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
