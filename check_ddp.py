"""Check a DDP training script by running it: one line per DDP step, ok, warn or FAIL, with evidence.

    python check_ddp.py my_train.py                    # your script, with its own defaults
    python check_ddp.py my_train.py --epochs 2         # and with its own arguments
    python check_ddp.py --nproc 4 --silence 60 my_train.py
    python check_ddp.py --explain DDP305               # what a finding means, and what to do
    python check_ddp.py --judge /tmp/check_ddp-XXXX    # a job already run, judged again

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

How it works, in the order the data flows (the sections of this file, in this order):

1. run: run_job() starts torchrun with this file loaded in each of its workers, and stops a
   job that makes no progress. All that the job leaves is in its folder: each rank's records
   (rank<R>.jsonl), the job's output (output.log) and how it ended (job.json). That folder is
   enough to judge the job again (--judge), without running anything.
2. record: in each worker, watch() puts WRAPPERS around what a DDP script calls, one small
   function per call, each declaring its step and the label a report prints (CALLS). Each
   writes records of the kinds that SCHEMA declares, the contract between watcher and judge.
3. judge: Facts reads a job and derives, once, what several rules need (the loaders' passes,
   the crash, where each rank waits). Each RULES entry is one finding: a code (DDP3xx for
   step 3), its verdict, its help, and its docstring, the explanation --explain prints. For
   each step, the first rule that finds something is the step's line; else the step's
   summary says ok, or -- for not checked.
4. report: a line per step, the verdict last.

How to add a check: if the records do not show it yet, add the field or the kind to SCHEMA
and record it in a wrapper (@watches); write the rule (@rule) among its step's rules, in the
order they are tried, its docstring saying what happens, why, and what to do; then add a case
to tests/check_ddp_cases/ whose first line names the code (tests/check_ddp_cases/README.md).
"""

import argparse
import ast
import functools
import importlib
import inspect
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
from dataclasses import dataclass
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
PITFALLS = {  # the programs in pitfalls/, beside this file in its project, that show each mistake
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
    parser.add_argument(
        "--explain",
        nargs="?",
        const="",
        metavar="CODE",
        help="explain what a finding's code means (alone: list every code); runs nothing",
    )
    parser.add_argument(
        "--judge", metavar="FOLDER", help="judge again the job a check left in FOLDER; runs nothing"
    )
    parser.add_argument("script", nargs="?", help="your training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its own arguments")
    options = parser.parse_args(argv)
    if options.explain is not None:
        text = explain(options.explain)
        if text is None:
            parser.error(f"{options.explain}: no such code (python check_ddp.py --explain lists them)")
        print(text)
        return 0
    if options.judge:
        if not (Path(options.judge) / "job.json").is_file():
            parser.error(f"{options.judge}: not the folder of a job (it has no job.json)")
        job = Job.load(options.judge)
    else:
        if options.script is None:
            parser.error("name your training script: python check_ddp.py my_train.py [its args]")
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
# 1. run: torchrun, with a watcher in each of its processes; the job's folder


class Job:
    """What a run of the script left in its folder, all the judge reads: each rank's records
    (rank<R>.jsonl), the job's output (output.log), and how it ended (job.json: the command,
    the device, exit status, seconds, whether it hung or stuck at exit, the folder it ran in,
    and the text of the script's files that the records cite)."""

    ENDING = (
        "command",
        "nproc",
        "silence",
        "device",
        "cwd",
        "returncode",
        "seconds",
        "hung",
        "stuck_at_exit",
    )

    def __init__(self, folder, command, nproc, silence, device, cwd):
        self.folder, self.command, self.nproc, self.silence = Path(folder), command, nproc, silence
        self.device, self.cwd = device, cwd
        self.ranks = {}  # rank: its records, in order
        self.output = ""
        self.returncode = None
        self.seconds = 0.0
        self.hung = False  # stopped after --silence seconds without progress
        self.stuck_at_exit = False  # every rank finished its script, but a process did not end
        self.sources = {}  # a file the records cite (as they cite it): its text

    def records(self, kind, rank=None):
        ranks = self.ranks.items() if rank is None else [(rank, self.ranks.get(rank, []))]
        return [(r, e) for r, events in ranks for e in events if e["e"] == kind]

    def read_records(self):
        """Each rank's records as its watcher wrote them (a line cut off by a kill is left out)."""
        self.ranks = {}
        for path in sorted(self.folder.glob("rank*.jsonl")):
            lines = path.read_text().splitlines()
            self.ranks[int(path.stem[4:])] = [json.loads(line) for line in lines if line.endswith("}")]
        if os.environ.get("CHECK_DDP_STRICT"):
            for events in self.ranks.values():
                for event in events:
                    check_record(event)

    def source(self, path):
        """The text of one of the script's files, as the job saw it; None if unknown."""
        if path in self.sources:
            return self.sources[path]
        try:
            return Path(self.cwd, path).read_text()
        except (OSError, UnicodeDecodeError):
            return None

    def relpath(self, path):
        """A path the job wrote, as seen from the folder the job ran in."""
        return os.path.relpath(path, self.cwd)

    def save(self):
        """job.json: how the job ended, and the script's files that the records cite, so that the
        folder alone can be judged again (python check_ddp.py --judge FOLDER)."""
        cited = set()
        for events in self.ranks.values():
            for e in events:
                for at in [e.get("at"), *(e.get("stack") or [])]:
                    if isinstance(at, str) and ":" in at:
                        cited.add(at.rpartition(":")[0])
        self.sources = {path: text for path in sorted(cited) if (text := self.source(path)) is not None}
        ending = {name: getattr(self, name) for name in self.ENDING}
        (self.folder / "job.json").write_text(json.dumps({**ending, "sources": self.sources}, indent=1))

    @classmethod
    def load(cls, folder):
        saved = json.loads((Path(folder) / "job.json").read_text())
        job = cls(folder, saved["command"], saved["nproc"], saved["silence"], saved["device"], saved["cwd"])
        for name in cls.ENDING:
            setattr(job, name, saved[name])
        job.sources = saved["sources"]
        log = Path(folder) / "output.log"
        job.output = log.read_text(errors="replace") if log.is_file() else ""
        job.read_records()
        return job


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
    job = Job(
        folder,
        ["torchrun", *launch, options.script, *options.args],
        options.nproc,
        options.silence,
        device,
        os.getcwd(),
    )
    log = folder / "output.log"
    start = time.monotonic()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        wait_for(proc, job, options, log)
    job.seconds = time.monotonic() - start
    job.returncode = proc.returncode
    job.output = log.read_text(errors="replace")
    job.read_records()
    job.save()
    return job


def wait_for(proc, job, options, log):
    """Wait for the job to end; stop it once it makes no progress (its records and output stay
    the same) for --silence seconds: hung, or stuck at exit when every rank had finished."""
    seen, quiet_since, shown = None, time.monotonic(), 0
    while proc.poll() is None:
        time.sleep(0.2)
        if options.verbose:
            shown = show_new_output(log, shown)
        records = sorted(job.folder.glob("rank*.jsonl"))
        sizes = tuple(p.stat().st_size for p in records) + (log.stat().st_size,)
        # until every process has started (Python, torch), a minute: start-up is not a hang
        allowed = options.silence if len(records) == options.nproc else max(options.silence, 60)
        if sizes != seen:
            seen, quiet_since = sizes, time.monotonic()
        elif time.monotonic() - quiet_since > allowed:
            job.read_records()
            ended = {r for r, e in job.records("exit")} | {r for r, e in job.records("ddp_freed")}
            if not records or ended != set(job.ranks):
                job.hung = True
                stop(proc)
            elif time.monotonic() - quiet_since > allowed + 10:  # done, but not gone
                job.stuck_at_exit = True
                stop(proc)
    if options.verbose:
        show_new_output(log, shown)


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
# 2. record: runs inside the job's processes, around the calls a DDP script makes

# The records, the contract between the watcher (which writes them) and the judge (which reads
# them): each is a JSON line {"e": kind, field: value, ...}, with exactly these fields. `at` is
# always the script's own file:line that made the call.
SCHEMA = {
    # a process starts: who torchrun says it is, and what it has
    "start": ("rank", "local_rank", "world_size", "cuda", "gpus", "torch", "env"),
    # twice a second: the watched call the main thread is in (a CALLS key, or None), the script's
    # lines it came from (innermost first), the innermost frame of all
    "now": ("call", "stack", "inner"),
    # step 1: the script writes a launch variable over torchrun's; calls init_process_group (what
    # it passed); the group is made (what it is); destroy_process_group() of the whole group
    "env": ("key", "value", "torchrun", "at"),
    "init": ("at", "backend", "init_method", "rank", "world_size", "store"),
    "met": ("seconds", "rank", "world_size", "backend"),
    "destroy": ("at",),
    # steps 5, 6, 9: a collective the script called itself, after `step` optimizer steps
    "coll": ("name", "at", "step"),
    # step 3: a DataLoader made (its dataset's length and a fingerprint of its data; its
    # DistributedSampler's settings, or false); a pass over it begins; a batch of it (the
    # dataset indices it holds, or for an iterable dataset a fingerprint of its data)
    "loader": ("id", "at", "dataset", "length", "batches", "data", "sampler", "distributed"),
    "pass": ("loader", "n", "at"),
    "batch": ("loader", "idx", "data"),
    "set_epoch": ("epoch", "at"),
    "join": ("at",),
    # step 4: a DDP model made; one freed (training done); an optimizer step, with what happened
    # since the last (backward passes, those that all-reduced, forwards through DDP, .item()
    # calls by line, the loader of the last batch)
    "ddp": (
        "at",
        "module",
        "compiled",
        "compiled_inside",
        "device_ids",
        "find_unused_parameters",
        "devices",
        "parameters",
    ),
    "ddp_freed": (),
    "step": ("n", "backward", "synced", "forward", "items", "loader"),
    "compile": ("how", "at", "wraps_ddp", "target"),
    # step 6: torch.save (where, what it holds: describe_checkpoint), torch.load, any file written
    "save": ("path", "at", "what"),
    "load": ("path", "at", "weights_only", "map_location"),
    "write": ("path", "at", "how", "source"),
    # step 8: the script starts processes of its own
    "spawn": ("at",),
    # the script's own uncaught error: where, in which watched call (CALLS key), in which loader
    "crash": ("type", "message", "at", "call", "loader"),
    # the process ends: its replicas' weights summed, each training forward's input summed, the
    # graphs torch.compile made, its optimizer steps, its forwards through DDP without gradients
    "exit": ("weights", "inputs", "graphs", "steps", "evaluations"),
}


def check_record(event):
    """Refuse a record that does not fit SCHEMA (the tests turn this on: CHECK_DDP_STRICT=1)."""
    kind = event.get("e")
    if kind not in SCHEMA or set(event) - {"e"} != set(SCHEMA[kind]):
        raise ValueError(f"check_ddp: a record that does not fit SCHEMA[{kind!r}]: {event}")


class Recorder:
    """A rank's records, each appended to rank<R>.jsonl as it happens (a line written is the
    system's, even if the process then aborts), and a background thread that notes twice a second
    where the main thread is: so that even a rank stuck in a collective, or killed, leaves what it
    did and where it waits."""

    def __init__(self, path):
        # reentrant: a record can be added while another is written (a finalizer run by the garbage
        # collector, in the middle of one)
        self.file, self.lock = open(path, "a", buffering=1), threading.RLock()
        self.enabled = True
        self.strict = bool(os.environ.get("CHECK_DDP_STRICT"))
        self.position = None
        self.main = threading.main_thread().ident
        threading.Thread(target=self.note_position, daemon=True, name="check_ddp").start()

    def add(self, kind, **fields):
        if self.enabled:
            event = {"e": kind, **fields}
            if self.strict:
                check_record(event)
            line = json.dumps(event, default=str, separators=(",", ":")) + "\n"
            with self.lock:
                self.file.write(line)

    def note_position(self):
        while True:
            time.sleep(0.5)
            position = main_thread_position(self.main)
            if position != self.position or position[3]:  # compiling: busy, however long one step takes
                self.position = position
                self.add("now", call=position[0], stack=position[1], inner=position[2])


# Whose code a frame is: the script's own, or torch's, the standard library's, this file's.
THIS_FILE = os.path.realpath(__file__)
TORCH_DIR = ""  # torch's own folder: set once torch is imported, in watch()
LIBRARY_DIRS = tuple(
    os.path.realpath(p) for p in {sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}
)


def is_users(filename):
    """A frame of the script's own code, not torch's, the standard library's, or this file's."""
    path = os.path.realpath(filename)
    return not (
        filename.startswith("<")
        or path == THIS_FILE
        or (TORCH_DIR and path.startswith(TORCH_DIR))
        or path.startswith(LIBRARY_DIRS)
    )


def place(frame):
    return f"{os.path.relpath(frame.f_code.co_filename)}:{frame.f_lineno}"


def callers_frame():
    """The frame that called into this file: the first one, going out, that is not this file's.
    However deep a wrapper calls this, the answer is the same."""
    frame = sys._getframe(1)
    while frame is not None and os.path.realpath(frame.f_code.co_filename) == THIS_FILE:
        frame = frame.f_back
    return frame


def where():
    """file:line of the script's code that made the current call (going out past torch's frames)."""
    frame = callers_frame()
    while frame is not None and not is_users(frame.f_code.co_filename):
        frame = frame.f_back
    return place(frame) if frame is not None else None


def called_by_user():
    """Whether the current call comes straight from the script's code (not from torch's own)."""
    frame = callers_frame()
    return frame is not None and is_users(frame.f_code.co_filename)


def main_thread_position(main):
    """(the watched call the main thread is in, or None; the script's lines it came from, innermost
    first; the innermost frame, which moves while it computes; whether torch is compiling)."""
    frame = sys._current_frames().get(main)
    call, stack, inner, compiling = None, [], place(frame) if frame else None, False
    while frame is not None:
        if call is None and not stack and frame.f_code in CALL_OF_CODE:
            call = CALL_OF_CODE[frame.f_code]
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


@dataclass(frozen=True)
class Call:
    """A call the watcher wraps: the step it belongs to, and how a report names it."""

    step: int
    label: str


@dataclass(frozen=True)
class Wrapper:
    owner: str  # a module or a class, by its dotted name: resolved in the job's process
    name: str  # the attribute wrapped
    key: str  # the CALLS key: what a record names the call by
    make: object  # make(original, watcher, name) -> the function put in its place
    compiled_through: bool  # torch.compile must not trace the wrapper, only what it wraps


WRAPPERS = []  # in the order watch() applies them
CALLS = {}  # key: Call
CALL_OF_CODE = {}  # each applied wrapper's code object: its CALLS key (to tell a frame's call)


def watches(owner, *names, step, label, compiled_through=False):
    """Declare a wrapper of owner.name, for each name: `label` may hold {name}."""

    def register(make):
        for name in names:
            key = f"{owner}.{name}"
            CALLS[key] = Call(step, label.format(name=name))
            WRAPPERS.append(Wrapper(owner, name, key, make, compiled_through))
        return make

    return register


def resolve(dotted):
    """A module or a class by its dotted name: torch.distributed, torch.utils.data.DataLoader."""
    try:
        return importlib.import_module(dotted)
    except ImportError:
        module, _, name = dotted.rpartition(".")
        return getattr(importlib.import_module(module), name)


class Watcher:
    """What the wrappers of one process share: its recorder, and what the script did so far."""

    def __init__(self, rec):
        self.rec = rec
        self.state = {  # what happened since the last optimizer step
            "backward": 0,
            "synced": 0,
            "forward": 0,
            "items": {},
            "step": 0,
            "evaluations": 0,
            "pass": None,  # the DataLoader pass that gave the last batch
        }
        self.loaders = []  # the script's DataLoaders, by their id
        self.live_ddp = []  # weak references to the DDP models made
        self.weights = []  # the parameters of those models, or of the first optimizer: fingerprinted at exit
        self.inputs = []  # a fingerprint of each training forward's first input, kept on its device
        self.written = set()  # (file, line, how) already recorded
        self.folder = os.path.realpath(os.environ["CHECK_DDP_FOLDER"])
        self.caches = os.path.realpath(os.path.expanduser("~/.cache"))

    def apply(self, wrapper):
        owner = resolve(wrapper.owner)
        original = getattr(owner, wrapper.name, None)
        if original is None:
            return
        function = functools.wraps(original)(wrapper.make(original, self, wrapper.name))
        # a code object of its own, so that a frame of it names its call (wrappers share their code)
        function.__code__ = function.__code__.replace(co_name=f"{function.__code__.co_name}_{wrapper.name}")
        CALL_OF_CODE[function.__code__] = wrapper.key
        if wrapper.compiled_through:
            import torch

            function = torch.compiler.disable(function, recursive=False)
        setattr(owner, wrapper.name, function)


def watch():
    """Wrap what a DDP script calls, in this process of the job, and record what it does."""
    global TORCH_DIR
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

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
    watcher = Watcher(rec)
    for wrapper in WRAPPERS:
        watcher.apply(wrapper)
    register_optimizer_step_post_hook(functools.partial(after_step, watcher))
    sys.addaudithook(functools.partial(audit, watcher))
    sys.excepthook = functools.partial(excepthook, watcher, sys.excepthook)
    import atexit

    atexit.register(at_exit, watcher)


# The wrappers, by step. Each make() returns the function that stands in for the original.

# DDP step 1: the launch variables the script writes, and the group it makes


@watches("os._Environ", "__setitem__", step=1, label="os.environ[...] = ...")
def environ_setitem(original, w, _):
    def environ_setitem(self, key, value):
        if self is os.environ and key in LAUNCH_VARIABLES and os.environ.get(key) != value:
            w.rec.add("env", key=key, value=value, torchrun=os.environ.get(key), at=where())
        return original(self, key, value)

    return environ_setitem


@watches("torch.distributed", "init_process_group", step=1, label="init_process_group()")
def init_process_group(original, w, _):
    import torch.distributed as dist

    signature = inspect.signature(original)

    def init_process_group(*args, **kwargs):
        given = signature.bind_partial(*args, **kwargs).arguments
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
        if not args and not kwargs:  # the whole job's group, not a subgroup
            w.rec.add("destroy", at=where())
        return original(*args, **kwargs)

    return destroy_process_group


# DDP steps 5, 6, 9: the script's own collectives, each with where it was called
COLLECTIVES = (
    "all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "barrier", "monitored_barrier", "broadcast_object_list", "all_gather_object",
    "gather", "gather_object", "scatter", "scatter_object_list", "all_to_all", "all_to_all_single",
)  # fmt: skip
REDUCING = ("all_reduce", "reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "gather")


@watches("torch.distributed", *COLLECTIVES, step=5, label="dist.{name}()")
def collective(original, w, name):
    def watched_collective(*args, **kwargs):
        if called_by_user():
            w.rec.add("coll", name=name, at=where(), step=w.state["step"])
        return original(*args, **kwargs)

    return watched_collective


# DDP step 3: each DataLoader, its dataset and sampler, and the indices of every batch


@watches("torch.utils.data.DataLoader", "__init__", step=3, label="DataLoader(...)")
def dataloader_init(original, w, _):
    from torch.utils.data import DistributedSampler

    def dataloader_init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        if not called_by_user():
            return
        self._check_ddp_id = len(w.loaders)
        w.loaders.append(self)
        sampler, distributed = self.batch_sampler or self.sampler, None
        for _ in range(4):  # BatchSampler(DistributedSampler(...)), and the like
            if isinstance(sampler, DistributedSampler):
                distributed = sampler
                break
            sampler = getattr(sampler, "sampler", None)
        dataset, offset = self.dataset, None
        while hasattr(dataset, "indices") and hasattr(dataset, "dataset"):  # a Subset: the indices
            offset = (
                [int(i) for i in dataset.indices] if offset is None else [offset[i] for i in dataset.indices]
            )
            dataset = dataset.dataset
        self._check_ddp_indices = offset
        w.rec.add(
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


@watches("torch.utils.data.DataLoader", "__iter__", step=3, label="iter(DataLoader)")
def dataloader_iter(original, w, _):
    def dataloader_iter(self):
        iterator = original(self)
        if hasattr(self, "_check_ddp_id"):
            iterator._check_ddp_pass = {"loader": self._check_ddp_id, "batches": 0, "backward": 0}
            self._check_ddp_passes = getattr(self, "_check_ddp_passes", 0) + 1
            w.rec.add("pass", loader=self._check_ddp_id, n=self._check_ddp_passes, at=where())
        return iterator

    return dataloader_iter


@watches("torch.utils.data.dataloader._BaseDataLoaderIter", "_next_index", step=3, label="next(DataLoader)")
def dataloader_next_index(original, w, _):
    def dataloader_next_index(self):
        index = original(self)
        current = getattr(self, "_check_ddp_pass", None)
        if current is not None:
            indices = index if isinstance(index, (list, tuple)) else [index]
            if all(isinstance(i, int) for i in indices):  # a map-style dataset's indices
                offset = w.loaders[current["loader"]]._check_ddp_indices
                indices = [offset[i] for i in indices] if offset else list(indices)
                w.rec.add("batch", loader=current["loader"], idx=indices, data=None)
        return index

    return dataloader_next_index


@watches("torch.utils.data.dataloader._BaseDataLoaderIter", "__next__", step=3, label="next(DataLoader)")
def dataloader_next(original, w, _):
    def dataloader_next(self):
        batch = original(self)
        current = getattr(self, "_check_ddp_pass", None)
        if current is not None:
            current["batches"] += 1
            w.state["pass"] = current
            if w.loaders[current["loader"]]._check_ddp_indices is None and self._dataset_kind == 1:
                w.rec.add("batch", loader=current["loader"], idx=None, data=fingerprint(batch))  # iterable
        return batch

    return dataloader_next


@watches("torch.utils.data.DistributedSampler", "set_epoch", step=3, label="sampler.set_epoch()")
def sampler_set_epoch(original, w, _):
    def sampler_set_epoch(self, epoch):
        if called_by_user():
            w.rec.add("set_epoch", epoch=epoch, at=where())
        return original(self, epoch)

    return sampler_set_epoch


@watches("torch.distributed.algorithms.join.Join", "__init__", step=3, label="Join(...)")
def join_init(original, w, _):
    def join_init(self, *args, **kwargs):
        w.rec.add("join", at=where())
        return original(self, *args, **kwargs)

    return join_init


# DDP step 4: the wrapper, what goes through it, and the replicas' weights


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

    def ddp_init(self, module, *args, **kwargs):
        original(self, module, *args, **kwargs)
        w.live_ddp.append(weakref.ref(self, functools.partial(ddp_freed, w.rec)))
        w.weights.extend(self.module.parameters())
        inner = getattr(module, "_orig_mod", module)
        w.rec.add(
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


@watches(
    "torch.nn.parallel.DistributedDataParallel", "forward", step=4, label="DDP forward", compiled_through=True
)
def ddp_forward(original, w, _):
    import torch

    def ddp_forward(self, *args, **kwargs):
        if not torch.is_grad_enabled():
            w.state["evaluations"] += 1  # a forward without gradients: evaluation, or inference
        else:
            w.state["forward"] += 1
            first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
            if first is not None and first.numel():
                flat = first.detach().reshape(-1)
                sample = flat[:: max(1, flat.numel() // 1024)][:1024].double()
                w.inputs.append((sample * torch.arange(1, len(sample) + 1, device=sample.device)).sum())
        return original(self, *args, **kwargs)

    return ddp_forward


@watches("torch.autograd", "backward", step=4, label="backward()")
def autograd_backward(original, w, _):
    def autograd_backward(*args, **kwargs):
        models = [m for m in (ref() for ref in w.live_ddp) if m is not None]
        w.state["backward"] += 1
        w.state["synced"] += any(m.require_backward_grad_sync for m in models)
        if w.state["pass"] is not None:
            w.state["pass"]["backward"] += 1
        return original(*args, **kwargs)

    return autograd_backward


def after_step(w, optimizer, args, kwargs):
    """Every optimizer step (torch's post-step hook): what happened since the last."""
    state = w.state
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
    )
    state.update(backward=0, synced=0, forward=0, items={})


@watches("torch.Tensor", "item", step=5, label=".item()")
def tensor_item(original, w, _):
    def tensor_item(self):
        if called_by_user():
            at = where()
            w.state["items"][at] = w.state["items"].get(at, 0) + 1
        return original(self)

    return tensor_item


@watches("torch", "compile", step=4, label="torch.compile()")
@watches("torch.nn.Module", "compile", step=4, label="Module.compile()")
def watched_compile(original, w, name):
    from torch.nn.parallel import DistributedDataParallel

    how = "torch.compile" if original.__qualname__ == "compile" else "Module.compile"

    def watched_compile(*args, **kwargs):
        target = args[0] if args else kwargs.get("model")
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


# DDP step 6: checkpoints saved and loaded, and every file written


@watches("torch", "save", step=6, label="torch.save()")
def torch_save(original, w, _):
    def torch_save(obj, f, *args, **kwargs):
        if called_by_user():
            path = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
            w.rec.add("save", path=path and os.path.abspath(path), at=where(), what=describe_checkpoint(obj))
        return original(obj, f, *args, **kwargs)

    return torch_save


@watches("torch", "load", step=6, label="torch.load()")
def torch_load(original, w, _):
    def torch_load(f, *args, **kwargs):
        if called_by_user():
            path = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
            w.rec.add(
                "load",
                path=path and os.path.abspath(path),
                at=where(),
                weights_only=kwargs.get("weights_only"),
                map_location="map_location" in kwargs or len(args) > 0,
            )
        return original(f, *args, **kwargs)

    return torch_load


def audit(w, event, args):
    """Python's audit hook: every file the script opens to write, or renames into place."""
    if not w.rec.enabled or event not in ("open", "os.rename", "os.replace"):
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
    if target.startswith((w.folder, "/dev/", "/proc/", "/sys/", w.caches, *LIBRARY_DIRS)) or re.search(
        r"torchinductor|triton|__pycache__", target
    ):
        return  # not the script's files: this tool's, the system's, torch's caches
    at = where()
    if (target, at, event) not in w.written:
        w.written.add((target, at, event))
        source = os.path.realpath(os.fsdecode(args[0])) if event != "open" else None
        w.rec.add("write", path=target, at=at, how=event, source=source)


# DDP step 8: a script that starts its own processes


@watches("torch.multiprocessing", "spawn", "start_processes", step=8, label="mp.{name}()")
def multiprocessing_spawn(original, w, name):
    def multiprocessing_spawn(*args, **kwargs):
        w.rec.add("spawn", at=where())
        raise SystemExit(
            "check_ddp: this script starts its own processes (torch.multiprocessing.spawn); "
            "under torchrun, each process is already one of the job's"
        )

    return multiprocessing_spawn


# a crash: the script's own error, where it was raised, and in which watched call; the end


def excepthook(w, previous_hook, kind, error, tb):
    import traceback

    frames = traceback.extract_tb(tb)
    users = [f for f in frames if is_users(f.filename)]
    call, walk = None, tb
    while walk is not None:
        call = CALL_OF_CODE.get(walk.tb_frame.f_code, call)
        walk = walk.tb_next
    w.rec.add(
        "crash",
        type=kind.__name__,
        message=str(error).strip()[:400],
        at=f"{os.path.relpath(users[-1].filename)}:{users[-1].lineno}" if users else None,
        call=call,
        loader=w.state["pass"] and w.state["pass"]["loader"],
    )
    previous_hook(kind, error, tb)


def at_exit(w):
    import torch

    values = {}
    if w.weights:
        with torch.no_grad():
            flat = [p.detach().double().reshape(-1) for p in w.weights]
            values = {
                "sum": sum(float(p.sum()) for p in flat),
                "squares": sum(float((p * p).sum()) for p in flat),
                "count": sum(p.numel() for p in flat),
            }
    graphs = None
    if "torch._dynamo" in sys.modules:
        graphs = sys.modules["torch._dynamo"].utils.counters["stats"]["unique_graphs"]
    w.rec.add(
        "exit",
        weights=values,
        inputs=[float(x) for x in torch.stack(w.inputs).tolist()] if w.inputs else [],
        graphs=graphs,
        steps=w.state["step"],
        evaluations=w.state["evaluations"],
    )


# -----------------------------------------------------------------------------
# 3. judge: what the records say, one rule per finding


@dataclass
class Line:
    """A step's line in the report: its verdict (ok, warn, FAIL, or -- for not checked), what it
    rests on, and for a finding its rule's code, help and pitfall; what of the job's end it
    accounts for ("crash", "hang")."""

    step: int
    verdict: str
    message: str
    code: str = None
    help: str = None
    see: str = None
    explains: frozenset = frozenset()


@dataclass
class Found:
    """What a rule returns when it finds its mistake: the message, built from the evidence, and,
    where the evidence changes them, its help and what of the job's end it explains."""

    message: str
    help: str = None
    explains: tuple = None


@dataclass
class Rule:
    code: str  # DDP<step><nn>: DDP306 is step 3's; DDP1003, step 10's; DDP000, a crash at any step
    step: int
    verdict: str  # FAIL or warn
    check: object  # check(facts) -> Found, or None
    help: str
    see: str  # a key of PITFALLS, or None
    explains: tuple  # "crash", "hang": what of the job's end the finding accounts for, by default

    @property
    def doc(self):
        return inspect.cleandoc(self.check.__doc__ or "")


RULES = {}  # code: Rule, each step's in the order they are tried
SUMMARIES = {}  # step: the function saying ok or -- (not checked) when no rule finds anything


def rule(code, verdict, help, see=None, explains=()):
    """Declare a rule: the function under it looks at the facts and returns Found, or None."""

    def register(check):
        assert code not in RULES, f"{code} is taken"
        step = 0 if code == "DDP000" else int(code[3:-2])
        RULES[code] = Rule(code, step, verdict, check, help, see, tuple(explains))
        return check

    return register


def summary(step):
    """Declare what a step says when none of its rules finds anything: (verdict, message), or None
    for no line."""

    def register(function):
        SUMMARIES[step] = function
        return function

    return register


def judge(job):
    """A line per step: the first of its rules that finds something, else its summary; then a
    crash that no line explains, at the step it happened in."""
    facts = Facts(job)
    lines = []
    for step in STEPS:
        line = judge_step(facts, step)
        if line is not None:
            lines.append(line)
            facts.explained |= line.explains
    if facts.crash is not None and "crash" not in facts.explained:
        line = finding(RULES["DDP000"], RULES["DDP000"].check(facts), step=crash_step(facts, facts.crash[1]))
        lines = [old for old in lines if old.step != line.step] + [line]
    return sorted(lines, key=lambda line: line.step)


def judge_step(facts, step):
    for rule in RULES.values():
        if rule.step == step:
            found = rule.check(facts)
            if found is not None:
                return finding(rule, found)
    said = SUMMARIES[step](facts)
    return Line(step, *said) if said else None


def finding(rule, found, step=None):
    explains = rule.explains if found.explains is None else found.explains
    return Line(
        step or rule.step, rule.verdict, found.message, rule.code, found.help or rule.help, rule.see,
        frozenset(explains),
    )  # fmt: skip


def explain(code):
    """--explain: every code with its one-line summary; --explain CODE: that rule's page."""
    if not code:
        rows = [
            f"{r.code:<8} step {r.step or '-':<3} {r.verdict:<5} {r.doc.splitlines()[0]}"
            for r in RULES.values()
        ]
        return "\n".join(
            ["The findings of check_ddp.py (python check_ddp.py --explain CODE explains one):", *rows]
        )
    rule = RULES.get(code.upper())
    if rule is None:
        return None
    step = f"step {rule.step}, {STEPS[rule.step]}" if rule.step else "the step the script was in"
    head = f"{rule.code} ({rule.verdict}, {step})"
    parts = [head, "", rule.doc, "", f"help: {rule.help}"]
    if rule.see:
        where = pitfall_path(rule.see) or f"{PITFALLS[rule.see]}, in the project check_ddp.py comes from"
        parts.append(f"see:  {where}")
    return "\n".join(parts)


class Facts:
    """A job, and what is derived from its records once, for every rule that reads it."""

    def __init__(self, job):
        self.job = job
        self.explained = frozenset()  # what the lines so far account for: "crash", "hang"

    @functools.cached_property
    def world(self):
        return max((e["world_size"] for _, e in self.job.records("start")), default=0)

    @functools.cached_property
    def crash(self):
        """The crash that explains the others: a rank's own error before one that only reports a
        lost peer (torchrun stops the other ranks when one fails, and they may fail on its absence
        first). (rank, record), or None."""
        crashes = self.job.records("crash")
        return min(
            crashes, key=lambda c: (bool(COMMUNICATION_ERROR.search(c[1]["message"])), c[0]), default=None
        )

    def crashed_with(self, text):
        return self.crash is not None and text in self.crash[1]["message"]

    @functools.cached_property
    def loaders(self):
        """For each loader (by id): its records per rank, its passes' indices per rank, and whether
        optimizer steps ran on its batches (a training loader) or none did (an evaluation loader)."""
        loaders = {}
        for rank, events in self.job.ranks.items():
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
                    if e["idx"] is not None:
                        current[e["loader"]].extend(e["idx"])
                    else:
                        loaders[e["loader"]]["data"].setdefault(rank, []).append(e["data"])
                elif e["e"] == "step" and e.get("loader") in loaders:
                    loaders[e["loader"]]["training"] = True
        return loaders

    @functools.cached_property
    def training_loaders(self):
        return {i: loader for i, loader in self.loaders.items() if loader["training"]}

    @functools.cached_property
    def waiting(self):
        """Each rank's last known position: (the watched call it was in, the script's line, and
        the script's lines that led there, innermost first)."""
        found = {}
        for rank, event in self.job.records("now"):
            stack = event["stack"]
            found[rank] = (event["call"], stack[0] if stack else None, stack)
        return found

    def waiting_in(self, call):
        return sorted(r for r, (c, _, _) in self.waiting.items() if c == call)

    @functools.cached_property
    def never_met(self):
        """The job hung with ranks still in init_process_group(): they never all met."""
        waiting = self.waiting_in(INIT)
        return bool(self.job.hung and waiting and len(self.job.records("met")) < len(self.job.ranks))

    def stall(self):
        """How the ranks fell out of step, if they did: the text of a hang (where each rank waits),
        or of a rank that lost its peers; None. Asked at step 5, once step 1 has said whether it
        explains a hang (the ranks never met)."""
        job = self.job
        if job.hung and job.records("met") and "hang" not in self.explained:
            parts = []
            for rank in sorted(job.ranks):
                call, at, _ = self.waiting.get(rank, (None, None, []))
                what = CALLS[call].label if call in CALLS else "its own code"
                if call == BACKWARD and job.records("ddp"):
                    what = "backward(), DDP's gradient all-reduce"
                parts.append(
                    f"rank {rank} waits in {what} at {self.code(at)}" if at else f"rank {rank}: not known"
                )
            return f"the job stopped making progress ({job.silence:g} s without any): " + "; ".join(parts)
        if self.crash and COMMUNICATION_ERROR.search(self.crash[1]["message"]) and self.cause(hang=False):
            rank, e = self.crash
            return f"rank {rank} lost its peers at {self.code(e['at'])} ({short(e['message'])})"
        return None

    def cause(self, hang=True):
        """Why the ranks fell out of step, seen from what each did: (code of the rule, the cause as
        evidence), or None. Only a hang shows where each rank waits."""
        for _, (call, at, stack) in sorted(self.waiting.items() if hang else ()):
            for line in stack if call and call != BACKWARD else ():
                condition = self.rank_condition(line)
                if condition:
                    reached = f"{CALLS[call].label} at {at}" + (
                        f", called from {line}," if line != at else ""
                    )
                    return "DDP501", f"{reached} is inside `{condition}`: only some ranks reach it"
        if not self.job.records("join"):
            for loader in self.loaders.values():
                batches = {r: e["batches"] for r, e in loader["made"].items() if e["batches"] is not None}
                if loader["training"] and len(set(batches.values())) > 1:
                    return "DDP502", (
                        "the ranks have different numbers of batches an epoch ("
                        + ", ".join(f"rank {r}: {n}" for r, n in sorted(batches.items()))
                        + f", DataLoader at {next(iter(loader['made'].values()))['at']}): uneven inputs, and "
                        "every backward() all-reduces with every rank"
                    )
        steps = {r: len([e for e in events if e["e"] == "step"]) for r, events in self.job.ranks.items()}
        if len(set(steps.values())) > 1:
            return "DDP503", (
                "the ranks left the training loop at different steps ("
                + ", ".join(f"rank {r}: {c}" for r, c in sorted(steps.items()))
                + ")"
            )
        return None

    @functools.cached_property
    def weights_differ(self):
        """How the replicas' weights differ at the end ("" when they are equal; None when fewer
        than two ranks had any)."""
        weights = {r: e["weights"] for r, e in self.job.records("exit") if e["weights"]}
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

    @functools.cached_property
    def renamed(self):
        """Files written under one name, then renamed into place: the name each ended under."""
        return {
            e["source"]: e["path"] for _, e in self.job.records("write") if e["how"] != "open" and e["source"]
        }

    @functools.cached_property
    def evaluation(self):
        """The evaluation loaders (passes over them, no optimizer step on their batches), by id."""
        return {
            i: loader for i, loader in self.loaders.items() if not loader["training"] and loader["passes"]
        }

    @functools.cached_property
    def evaluated(self):
        """How the first evaluation loader that every rank went over was shared out: (how, loader
        id, the DataLoader's line, held-out samples, samples counted twice); how is "all" (every
        rank evaluated all of it), "unreduced" (each its shard, and no collective followed),
        "padded" or "exact". None if no evaluation loader."""
        for i, loader in self.evaluation.items():
            passes = loader["passes"]
            at = next(iter(loader["made"].values()))["at"]
            if len(passes) < self.world:
                continue
            shards = {r: p[0] for r, p in passes.items()}
            union = set().union(*map(set, shards.values()))
            total = sum(map(len, shards.values()))
            if all(set(s) == union for s in shards.values()) and self.world > 1:
                return "all", i, at, len(union), 0
            if not self.reduced_after_passes(i):
                return "unreduced", i, at, len(union), 0
            return ("padded" if total > len(union) else "exact"), i, at, len(union), total - len(union)
        return None

    def reduced_after_passes(self, loader):
        """Whether, on the lowest rank, a reducing collective follows each pass over loader before
        the next pass over any loader (or the end)."""
        pending = False
        for e in self.job.ranks[min(self.job.ranks)]:
            if e["e"] == "pass":
                if pending:
                    return False
                pending = e["loader"] == loader
            elif e["e"] == "coll" and e["name"] in REDUCING:
                pending = False
            elif e["e"] == "exit" and pending:
                return False
        return True

    def code(self, at):
        """The source line at file:line, short, in backquotes: the evidence a reader recognises."""
        if not at:
            return ""
        path, _, line = at.rpartition(":")
        try:
            text = self.job.source(path).splitlines()[int(line) - 1].strip()
        except (AttributeError, ValueError, IndexError):
            return at
        return f"{at} `{text if len(text) <= 70 else text[:67] + '...'}`"

    def rank_condition(self, at):
        """The `if` around file:line that tests a rank (if rank == 0:, if master_process:), if any."""
        if not at:
            return None
        path, _, line = at.rpartition(":")
        source = self.job.source(path)
        try:
            tree = ast.parse(source)
        except (TypeError, SyntaxError, ValueError):
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


# the calls the judge names (CALLS keys)
INIT = "torch.distributed.init_process_group"
BACKWARD = "torch.autograd.backward"
DDP_FORWARD = "torch.nn.parallel.DistributedDataParallel.forward"

COMMUNICATION_ERROR = re.compile(
    r"closed by peer|reset by peer|Connection refused|Timed out|timed out|doesn't match expected size|"
    r"collective mismatch|Broken pipe|NCCL communicator was aborted|Watchdog caught"
)


def crash_step(facts, event):
    """The step a rank was in when it failed: an evaluation loop's, the watched call's, or how far
    the job got."""
    job = facts.job
    if event.get("loader") in facts.loaders and not facts.loaders[event["loader"]]["training"]:
        return 10  # in an evaluation loop
    if event.get("call") in CALLS:
        return CALLS[event["call"]].step
    if not job.records("met"):
        return 1
    return 5 if job.records("ddp") else 3


def short(message):
    """An error's first sentence, without the C++ source locations torch puts in front."""
    message = re.sub(r"\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*", "", message or "").strip()
    first = message.splitlines()[0] if message else ""
    return first if len(first) <= 160 else first[:157] + "..."


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


# The rules of each step, in the order they are tried. A rule's docstring is its explanation
# (python check_ddp.py --explain CODE): its first line the summary; then what happens, why, and
# what to do.

# DDP step 1: init the process group


@rule(
    "DDP101",
    "FAIL",
    see="master_port",
    explains=("crash",),
    help="delete it: torchrun sets MASTER_ADDR and MASTER_PORT (and RANK, LOCAL_RANK, WORLD_SIZE), and "
    "init_process_group() reads them",
)
def master_port_set(f):
    """The script sets MASTER_ADDR or MASTER_PORT itself, over torchrun's.

    torchrun starts a store, where the processes of the job meet, on a port it picks, and gives
    every worker its address in MASTER_ADDR and MASTER_PORT. A script that writes its own (the
    guide's `os.environ['MASTER_PORT'] = '12355'`) sends its ranks to a place where no store
    runs, or where another job's does: they wait in init_process_group() until it times out, or
    meet the wrong job. Delete the lines; init_process_group() reads what torchrun set.
    """
    writes = [(r, e) for r, e in f.job.records("env") if e["key"] in ("MASTER_ADDR", "MASTER_PORT")]
    if not writes:
        return None
    _, e = next(((r, e) for r, e in writes if e["key"] == "MASTER_PORT"), writes[0])
    text = f"{f.code(e['at'])} sets {e['key']}={e['value']}, over torchrun's {e['torchrun']}"
    if f.never_met:
        text += (
            f": the ranks never met ({ranks_text(f.waiting_in(INIT))} waited in init_process_group() "
            f"until stopped after {f.job.silence:g} s without progress)"
        )
    # the ranks that did meet met someone else's job, or no one
    return Found(text, explains=("crash", "hang") if f.never_met else ("crash",))


@rule(
    "DDP102",
    "FAIL",
    help="read RANK, LOCAL_RANK and WORLD_SIZE from the environment torchrun made; never write them",
)
def launch_variable_set(f):
    """The script sets RANK, LOCAL_RANK or WORLD_SIZE itself, over torchrun's.

    torchrun tells each process who it is: RANK (its number in the job), LOCAL_RANK (on its
    node) and WORLD_SIZE. A script that overwrites them makes two processes claim one rank, or a
    world that is not the job's: init_process_group() then waits, or pairs the wrong processes.
    Read them; never write them.
    """
    for _, e in f.job.records("env"):
        return Found(f"{f.code(e['at'])} sets {e['key']}={e['value']}, over torchrun's {e['torchrun']}")
    return None


@rule(
    "DDP103",
    "FAIL",
    explains=("crash",),
    help="call dist.init_process_group(backend) first, in every process",
)
def group_needed_before_made(f):
    """A collective or DDP was used before any process group was made.

    Every call that exchanges data between processes (DDP's constructor, all_reduce, barrier)
    needs the job's process group, and dist.init_process_group() makes it. Without it, the
    first such call fails with "Default process group has not been initialized". Call
    init_process_group() at the start, in every process.
    """
    if not f.job.records("init") and f.crashed_with("process group has not been initialized"):
        at = f.crash[1]["at"]
        return Found(f"no rank called dist.init_process_group(), and {f.code(at)} needs the group")
    return None


@rule("DDP104", "FAIL", help="call dist.init_process_group(backend) first, in every process")
def no_process_group(f):
    """No process called init_process_group(): N processes trained N separate models.

    torchrun started the processes, but without a process group they never exchange anything:
    each trains its own model on its own copy of the data, and the job does the same work N
    times. Call dist.init_process_group() first, then wrap the model in DDP.
    """
    job = f.job
    if job.records("init") or not job.ranks:
        return None
    if (f.crash or job.records("spawn") or job.hung or job.returncode) and not job.records("step"):
        return None  # stopped before it could have made one: not checked
    return Found(
        f"no rank called dist.init_process_group(): each of the {len(job.ranks)} processes trained alone"
    )


@rule(
    "DDP105",
    "FAIL",
    see="master_port",
    help="pass no init_method: the default, env://, reads where torchrun's job meets",
)
def init_method_elsewhere(f):
    """init_process_group() is told to meet somewhere else than torchrun's store.

    An init_method such as tcp://localhost:12355 or file:///tmp/x sends the ranks to a place
    torchrun did not set up: they wait there, or meet the processes of another job. Leave
    init_method out; its default, env://, reads MASTER_ADDR and MASTER_PORT from torchrun.
    """
    inits = f.job.records("init")
    if inits and inits[0][1]["init_method"] not in (None, "env://"):
        e = inits[0][1]
        return Found(
            f"{f.code(e['at'])} passes init_method={e['init_method']!r}: not where torchrun's job meets"
        )
    return None


@rule("DDP106", "FAIL", help="leave rank= and world_size= out: init_process_group() reads them from torchrun")
def rank_passed_wrong(f):
    """init_process_group() is passed a rank or world size that is not torchrun's.

    torchrun numbers the processes; a rank or world_size the script works out for itself (from
    its own arguments, or from a device count) can give two processes the same rank, or a world
    that waits for processes that never come. Leave rank= and world_size= out.
    """
    for r, e in f.job.records("init"):
        env = next((s["env"] for rr, s in f.job.records("start") if rr == r), {})
        for key in ("rank", "world_size"):
            value = e[key]
            if value not in (None, -1) and str(value) != env.get(key.upper()):
                return Found(
                    f"{f.code(e['at'])} passes {key}={value} on rank {r}, but torchrun made it "
                    f"{key.upper()}={env.get(key.upper())}",
                    help=f"leave {key}= out: init_process_group() reads {key.upper()} from torchrun",
                )
    return None


@rule(
    "DDP107",
    "FAIL",
    explains=("hang",),
    help="every process of the job must call init_process_group() with what torchrun set",
)
def never_met(f):
    """The ranks never met: some waited in init_process_group() until the job was stopped.

    init_process_group() returns only once every rank of the world has arrived. Here some ranks
    were still waiting when the job stopped making progress: a rank that never called it (it
    crashed first, or took another branch), or ranks told different places or sizes.
    """
    inits = f.job.records("init")
    if inits and f.never_met:
        e = inits[0][1]
        return Found(
            f"the ranks never met: {ranks_text(f.waiting_in(INIT))} waited in init_process_group() at "
            f"{f.code(e['at'])} until stopped after {f.job.silence:g} s without progress"
        )
    return None


@summary(1)
def step_1_summary(f):
    job = f.job
    inits, met = job.records("init"), job.records("met")
    if not job.ranks:
        return "--", "not checked: the script never started (step 8)"
    if not inits:
        return "--", "not checked: the job stopped before any rank made its process group"
    if len(met) < len(job.ranks) or not met:
        return "--", "not checked: the job stopped before every rank had joined the group"
    seconds = max(m["seconds"] for _, m in met)
    return "ok", f"{len(met)} ranks met ({met[0][1]['backend']}) at {inits[0][1]['at']}, in {seconds:.1f} s"


# DDP step 2: place each process on its device


@rule(
    "DDP201",
    "FAIL",
    see="global_rank_device",
    explains=("crash",),
    help="use LOCAL_RANK, the process's number on its node, as the GPU index, not RANK",
)
def device_past_the_node(f):
    """A rank asked for a GPU its node does not have ("invalid device ordinal").

    GPUs are numbered per node, 0 to the node's count - 1. The global rank runs over every node:
    on the second node of 2 x 4 GPUs, rank 4 asks for cuda:4, which is not there. LOCAL_RANK is
    the process's number on its node: use it as the GPU index.
    """
    if f.crashed_with("invalid device ordinal"):
        rank, e = f.crash
        return Found(f"rank {rank} asked for a GPU its node lacks at {f.code(e['at'])}")
    return None


@rule(
    "DDP202",
    "FAIL",
    see="global_rank_device",
    help="torch.cuda.set_device(local_rank) and model.to(f'cuda:{local_rank}'), from LOCAL_RANK",
)
def model_on_another_gpu(f):
    """A rank's model is not on the GPU of its LOCAL_RANK.

    Each process must use its own GPU, the one numbered by its LOCAL_RANK: two processes on one
    GPU share its memory and its time, and nccl refuses them. Set the device from LOCAL_RANK,
    move the model there, and give DDP device_ids=[local_rank].
    """
    if f.job.device != "cuda":
        return None
    starts = {r: e for r, e in f.job.records("start")}
    devices = {r: e["devices"] for r, e in f.job.records("ddp")}
    wrong = {r: d for r, d in devices.items() if d != [f"cuda:{starts[r]['local_rank']}"]}
    if wrong:
        r, d = sorted(wrong.items())[0]
        return Found(f"rank {r} (LOCAL_RANK {starts[r]['local_rank']}) has its model on {', '.join(d)}")
    return None


@summary(2)
def step_2_summary(f):
    if f.job.device != "cuda":
        return "--", "not checked: no GPU here"
    devices = {r: e["devices"] for r, e in f.job.records("ddp")}
    if not devices:
        return "--", "not checked: no model was wrapped in DDP"
    return "ok", "each rank's model is on the GPU of its LOCAL_RANK: " + ", ".join(
        f"rank {r} on {d[0]}" for r, d in sorted(devices.items())
    )


# DDP step 3: shard the data


@rule(
    "DDP301",
    "FAIL",
    see="unseeded",
    help="give each rank its own part of the data: a DistributedSampler, or batches drawn from a generator "
    "seeded by rank",
)
def same_batches_without_loader(f):
    """Every rank trained on the very same batches, drawn without a DataLoader.

    DDP averages the ranks' gradients: if every rank computes them on the same batch, the
    average is that one batch's gradient, and N processes do the work of one. Each rank must
    see its own part of the data.
    """
    if f.training_loaders:
        return None
    inputs = {r: e["inputs"] for r, e in f.job.records("exit") if e["inputs"]}
    if len(inputs) == f.world > 1:
        n = min(map(len, inputs.values()))
        if n and len({tuple(v[:n]) for v in inputs.values()}) == 1:
            return Found(
                f"every rank trained on the very same batches ({n} steps compared; the script draws its "
                "batches without a DataLoader)"
            )
    return None


def datasets_differ(f, loader):
    """The ranks whose copies of the loader's dataset differ, and the message saying so; or None."""
    made = loader["made"]
    data = {r: e["data"] for r, e in made.items()}
    if len(set(data.values())) > 1 and None not in data.values():
        at = next(iter(made.values()))["at"]
        return (
            f"the ranks built different datasets: the data of the DataLoader at {f.code(at)} differs "
            f"between {ranks_text(sorted(data))}"
        )
    return None


@rule(
    "DDP302",
    "FAIL",
    see="unseeded",
    help="seed the data the same on every rank (torch.Generator().manual_seed(seed)), or build it on one "
    "rank and share it",
)
def different_datasets_sampled(f):
    """The ranks built different datasets, and a DistributedSampler shards them as if they were one.

    DistributedSampler gives rank r the indices r, r + N, r + 2N, ... of one dataset that it
    assumes is the same on every rank. If each rank draws its own (unseeded random data, a
    shuffle before the split), the shards are parts of different datasets: some samples are
    never seen, others twice. Seed the data alike on every rank, or build it once and share it.
    """
    for loader in f.training_loaders.values():
        message = datasets_differ(f, loader)
        if message and next(iter(loader["made"].values()))["distributed"]:
            return Found(message + ", and DistributedSampler assumes it is the same on every rank")
    return None


def whole_passes(loader):
    """Each rank's whole passes over a loader, its epochs: a script may peek at one batch
    (next(iter(loader))) to learn its size, and that pass is not an epoch."""
    whole = {}
    for rank, passes in loader["passes"].items():
        longest = max((len(p) for p in passes), default=0)
        whole[rank] = [p for p in passes if longest and len(p) >= longest / 2]
    return whole


def overlapping_shards(f):
    """The first epoch in which two ranks' shards share more samples than the sampler's padding
    can repeat: (loader, what the shards share), or None."""
    for loader in f.training_loaders.values():
        passes = whole_passes(loader)
        if len(passes) < 2:
            continue
        some = next(iter(loader["made"].values()))
        for n in range(min(len(p) for p in passes.values())):
            sets = {r: set(p[n]) for r, p in passes.items()}
            ranks = sorted(sets)
            shared = max(len(sets[a] & sets[b]) for a in ranks for b in ranks if a < b)
            if shared > f.world - 1:  # more than DistributedSampler's padding can repeat
                length = some["length"]
                if all(sets[r] == sets[ranks[0]] for r in ranks) and length and len(sets[ranks[0]]) >= length:
                    what = f"{ranks_text(ranks)} each drew all {length} samples in epoch {n + 1}"
                else:
                    what = (
                        f"in epoch {n + 1} the shards of {ranks_text(ranks)} share {shared} of their "
                        f"{min(len(s) for s in sets.values())} samples"
                    )
                return (
                    loader,
                    f"{what} (DataLoader at {f.code(some['at'])}): each rank trains on the same data",
                )
    return None


def sampler_misconfigured(f, loader):
    made = loader["made"]
    distributed = next(iter(made.values()))["distributed"]
    return distributed and (
        distributed["num_replicas"] != f.world
        or len({made[r]["distributed"]["rank"] for r in made}) < len(made)
    )


@rule(
    "DDP303",
    "FAIL",
    help="pass sampler=DistributedSampler(dataset) to the DataLoader, and drop shuffle=True (the sampler "
    "shuffles); call sampler.set_epoch(epoch) each epoch",
)
def no_distributed_sampler(f):
    """The ranks' shards overlap: each rank trains on the same data, with no DistributedSampler.

    A DataLoader with shuffle=True (or a plain sampler) gives every rank the whole dataset: N
    processes each go over all of it, and DDP averages gradients of the same samples. A
    DistributedSampler gives each rank its own shard, 1/N of the data.
    """
    found = overlapping_shards(f)
    if found and not sampler_misconfigured(f, found[0]):
        return Found(found[1])
    return None


@rule(
    "DDP304",
    "FAIL",
    help="leave num_replicas= and rank= out of DistributedSampler(...): the group knows them",
)
def sampler_told_wrong_world(f):
    """The ranks' shards overlap: their DistributedSampler was told a world that is not the group's.

    DistributedSampler(dataset) reads the world size and the rank from the process group. Passed
    by hand (num_replicas=1, rank=0, or a local rank on several nodes), they make ranks draw the
    same shard. Leave them out.
    """
    found = overlapping_shards(f)
    if found and sampler_misconfigured(f, found[0]):
        return Found(found[1])
    return None


@rule(
    "DDP305",
    "FAIL",
    see="set_epoch",
    help="call sampler.set_epoch(epoch) at the start of each epoch, on every rank",
)
def same_order_every_epoch(f):
    """The sampler shuffles once per job: sampler.set_epoch(epoch) is never called (or always alike).

    DistributedSampler seeds its shuffle with seed + epoch, and its epoch stays 0 until
    set_epoch() changes it: every epoch then visits the samples in the same order, in the same
    batches, which trains worse than a new shuffle each epoch. Call sampler.set_epoch(epoch) at
    the start of each epoch, on every rank.
    """
    for loader in f.training_loaders.values():
        passes = whole_passes(loader)
        if len(passes) < 2:
            continue
        orders = passes[min(passes)]
        if len(orders) >= 2 and orders[0] != sorted(orders[0]) and all(o == orders[0] for o in orders[1:]):
            set_epochs = [e for _, e in f.job.records("set_epoch")]
            told = f" (set_epoch always got {set_epochs[0]['epoch']})" if set_epochs else ""
            at = next(iter(loader["made"].values()))["at"]
            return Found(
                f"rank {min(passes)} drew the same order in each of its {len(orders)} epochs{told}: "
                f"the shuffle happens once per job (DataLoader at {f.code(at)})"
            )
    return None


@rule("DDP306", "warn", see="unseeded", help="if the data is random, seed it the same on every rank")
def different_datasets(f):
    """The ranks built different datasets (fine if each rank loads its own shard on purpose).

    Each rank's DataLoader holds other data. With no DistributedSampler that may be meant (each
    rank reads its own files), but if the data is random and unseeded, the ranks train on
    datasets that were never meant to differ. Seed it alike on every rank.
    """
    for loader in f.training_loaders.values():
        message = datasets_differ(f, loader)
        if message:
            return Found(message + " (fine if each rank loads its own shard on purpose)")
    return None


@summary(3)
def step_3_summary(f):
    if not f.training_loaders:
        inputs = {r: e["inputs"] for r, e in f.job.records("exit") if e["inputs"]}
        if len(inputs) == f.world > 1:
            return "--", (
                "not checked whether the shards cover the data: the script draws its batches "
                "without a DataLoader (its ranks' batches do differ)"
            )
        return "--", "not checked: no DataLoader gave batches to training"
    for loader in f.training_loaders.values():
        passes = whole_passes(loader)
        if len(passes) < 2:
            continue
        some = next(iter(loader["made"].values()))
        orders = passes[min(passes)]
        longest = max(map(len, orders))
        how = "DistributedSampler" if some["distributed"] else some["sampler"]
        detail = f"{how}: disjoint shards of {longest} samples a rank"
        if some["length"]:
            detail += f", of {some['length']}"
        if len(orders) >= 2:
            detail += ", a new order each epoch" if orders[0] != orders[1] else ""
        else:
            detail += " (one epoch: set_epoch not checked)"
        return "ok", f"{detail} (DataLoader at {some['at']})"
    return "--", "not checked"


# DDP step 4: wrap the model


@rule(
    "DDP401",
    "FAIL",
    see="unused_parameter",
    explains=("crash",),
    help="remove the parameter, or pass find_unused_parameters=True to DDP (slower)",
)
def unused_parameter(f):
    """A parameter got no gradient, so DDP's all-reduce never finished ("Expected to have finished ...").

    DDP all-reduces gradients in buckets, and a bucket goes once every parameter in it has its
    gradient. A parameter that forward() does not use never gets one: the bucket never goes, and
    the next iteration fails. Remove the parameter, use it, or pass find_unused_parameters=True
    (which walks the autograd graph after every forward: slower).
    """
    if f.crashed_with("Expected to have finished reduction"):
        rank, e = f.crash
        return Found(
            f"rank {rank}: a parameter got no gradient in the last step, so DDP's all-reduce never "
            f"finished ({f.code(e['at'])}): a parameter forward() does not use"
        )
    return None


@rule(
    "DDP402",
    "FAIL",
    explains=("crash",),
    help="convert to SyncBatchNorm only where the model is on GPUs: "
    "if device.type == 'cuda': model = nn.SyncBatchNorm.convert_sync_batchnorm(model)",
)
def sync_batchnorm_on_cpu(f):
    """SyncBatchNorm ran on a CPU, where it does not work.

    SyncBatchNorm all-reduces batch statistics across ranks in forward(), and only on GPUs; on
    a CPU it raises. Convert to SyncBatchNorm only when the model runs on GPUs.
    """
    if f.crashed_with("SyncBatchNorm"):
        rank, e = f.crash
        return Found(f"rank {rank}: {f.code(e['at'])}: {short(e['message'])}")
    return None


@rule(
    "DDP403",
    "FAIL",
    help="model = DDP(model, device_ids=[local_rank]) (no device_ids on a CPU), after moving it to its "
    "device",
)
def not_wrapped(f):
    """No rank wrapped its model in DDP: the ranks train apart, each its own replica.

    Without DDP nothing averages the gradients: each rank takes its own steps on its own shard,
    and the replicas drift apart. The job trains N different models, each on 1/N of the data.
    Wrap the model in DDP once it is on its device.
    """
    if f.job.records("step") and not f.job.records("ddp"):
        differ = f.weights_differ
        return Found(
            "no rank wrapped its model in DDP: the ranks train apart, each its own replica"
            + (f", and end apart: {differ}" if differ else "")
        )
    return None


@rule("DDP404", "FAIL", help="call the DDP model (ddp_model(x)) in training, not the model it wraps")
def wrapper_never_called(f):
    """The model is wrapped, but training calls the model it wraps: no gradient is all-reduced.

    DDP sets up the all-reduce of the gradients in its own forward(). Calling the inner model
    (model.module(x), or a reference kept from before the wrap) skips it: the gradients stay
    local, and the replicas drift apart. Train through the DDP model.
    """
    steps, ddp = f.job.records("step"), f.job.records("ddp")
    if steps and ddp and sum(e["forward"] for _, e in steps) == 0:
        differ = f.weights_differ
        return Found(
            f"the model is wrapped at {f.code(ddp[0][1]['at'])}, but training never calls the wrapper: no "
            "forward went through DDP, so no gradient was all-reduced" + (f" ({differ})" if differ else "")
        )
    return None


@rule(
    "DDP405",
    "FAIL",
    help="every rank must take the same optimizer steps on the DDP model's all-reduced gradients",
)
def replicas_differ(f):
    """The replicas' weights differ at the end of training.

    DDP keeps the replicas equal only if every rank applies the same update: the same optimizer
    steps, on the all-reduced gradients, with nothing changed on one rank alone (a learning rate
    set from a local metric, weights loaded on rank 0 after the wrap).
    """
    ddp = f.job.records("ddp")
    if f.job.records("step") and ddp and f.weights_differ:
        return Found(f"the replicas differ at the end: {f.weights_differ} (DDP at {f.code(ddp[0][1]['at'])})")
    return None


@rule(
    "DDP406",
    "warn",
    see="unused_parameter",
    help="leave find_unused_parameters out (it is False by default)",
)
def find_unused_for_nothing(f):
    """DDP(..., find_unused_parameters=True), and every parameter is used.

    With find_unused_parameters=True DDP walks the autograd graph after every forward to find
    parameters that will get no gradient. When there are none, that is work for nothing, every
    step; DDP says so in the job's output.
    """
    ddp = f.job.records("ddp")
    if f.job.records("step") and ddp and "did not find any unused parameters" in f.job.output:
        return Found(
            f"DDP(..., find_unused_parameters=True) at {f.code(ddp[0][1]['at'])}, and every parameter is "
            "used: DDP walks the autograd graph after every forward for nothing"
        )
    return None


@rule(
    "DDP407",
    "warn",
    see="compile_order",
    help="compile the bare model, then wrap it: model = DDP(torch.compile(model))",
)
def compiled_nothing(f):
    """torch.compile was applied in an order that compiles nothing.

    torch.compile(DDP(model)), or model.compile() before the wrap, can leave the compiler with
    nothing it captures (torch's counters show 0 graphs): the job runs uncompiled. Compile the
    bare model and wrap the compiled one: DDP(torch.compile(model)).
    """
    job = f.job
    if not job.records("step") or not job.records("ddp"):
        return None
    compiles = [e for _, e in job.records("compile") if e["wraps_ddp"]]
    compiled_before = [e for _, e in job.records("ddp") if e["compiled"]]
    graphs = max((e["graphs"] or 0 for _, e in job.records("exit")), default=0)
    if (compiles or compiled_before) and not graphs:
        e = compiles[0] if compiles else compiled_before[0]
        how = "torch.compile(DDP(model))" if compiles else "model.compile() before DDP(model)"
        return Found(f"{how} at {f.code(e['at'])} compiled nothing (torch's compiler captured 0 graphs)")
    return None


@summary(4)
def step_4_summary(f):
    job = f.job
    if not job.records("step"):
        return "--", "not checked: no optimizer step ran"
    total = max(e["steps"] for _, e in job.records("exit")) if job.records("exit") else None
    equal = "the replicas are equal at the end" if f.weights_differ == "" else "every forward went through it"
    return "ok", f"DDP at {job.records('ddp')[0][1]['at']}; {equal}" + (
        f" ({plural(total, 'step')})" if total else ""
    )


# DDP step 5: all-reduce the metrics (and the ranks falling out of step, which a collective shows)


def out_of_step(f, code):
    """The finding of a rule about ranks falling out of step, when the cause is its own."""
    stall = f.stall()
    if stall is None:
        return None
    hang = f.job.hung and "hang" not in f.explained
    cause = f.cause(hang=hang)
    if (cause[0] if cause else "DDP504") != code:
        return None
    if hang:
        return Found(stall + (f". {cause[1]}" if cause else ""))
    return Found(f"{stall}. {cause[1]}", explains=("crash",))


@rule(
    "DDP501",
    "FAIL",
    see="rank_zero_collective",
    help="take the collective out of the rank-only block: every rank must call it",
)
def collective_in_rank_block(f):
    """A collective inside a rank-only block (if rank == 0:): the other ranks never reach it.

    A collective (all_reduce, barrier, broadcast, and DDP's own, in forward and backward)
    returns only once every rank has called it. Called inside `if rank == 0:`, it waits forever
    for ranks that took the other branch; they meanwhile wait in their next collective. Take
    the collective out of the block: every rank calls it, and only the writing stays on rank 0.
    """
    return out_of_step(f, "DDP501")


@rule(
    "DDP502",
    "FAIL",
    see="uneven",
    help="give every rank as many batches: DistributedSampler (it pads, or drops with drop_last=True), or "
    "run the loop inside torch.distributed.algorithms.join.Join([model])",
)
def uneven_inputs(f):
    """Uneven inputs: the ranks have different numbers of batches an epoch, and DDP waits for the first done.

    Every backward() through DDP all-reduces with every rank. A rank with fewer batches leaves
    the loop first; the others wait in their next all-reduce for a rank that never comes (or,
    on gloo, fail on mismatched sizes). Give every rank as many batches (DistributedSampler pads
    or drops to make them equal), or train inside Join([model]), which lets ranks finish apart.
    """
    return out_of_step(f, "DDP502")


@rule(
    "DDP503",
    "FAIL",
    see="early_stop",
    help="decide to stop from values every rank has (all-reduce the metric first), so that all stop together",
)
def left_loop_apart(f):
    """The ranks left the training loop at different steps (an early stop decided by each rank alone).

    A decision to stop taken from a rank's own loss, a time limit, or a local counter, differs
    between ranks: one leaves, the others wait in their next collective. Decide from values
    every rank has, all-reduced, so that all stop at the same step.
    """
    return out_of_step(f, "DDP503")


@rule(
    "DDP504",
    "FAIL",
    see="rank_zero_collective",
    help="every rank must reach the same collectives, in the same order",
)
def stopped_making_progress(f):
    """The job stopped making progress after its ranks met, for a reason the records do not show.

    The report names where each rank waits. Most often a rank waits in a collective that another
    rank never reaches, or reaches in a different order.
    """
    return out_of_step(f, "DDP504")


@rule(
    "DDP505",
    "warn",
    see="metrics",
    help="on a GPU each waits for the GPU to finish; sum (loss x samples, samples) on the device and "
    "all-reduce it once an epoch",
)
def host_sync_every_step(f):
    """A host sync at every step, for logging (.item(), or a collective).

    On a GPU, .item() and a blocking all-reduce make the CPU wait until the GPU has finished all
    it was given: the next step's work is queued only after, and the GPU idles in between.
    Keep sums on the device, (loss x samples, samples), and all-reduce them once an epoch.
    """
    job = f.job
    steps = job.records("step", rank=min(job.ranks)) if job.ranks else []
    n = len(steps)
    if n < 8:
        return None
    sites = {}
    for _, e in job.records("coll", rank=min(job.ranks)):
        sites.setdefault((e["name"], e["at"]), set()).add(e["step"])
    every_step = [
        f"dist.{name}() at {f.code(at)}"
        for (name, at), at_steps in sites.items()
        if len(at_steps) >= 0.9 * n and name in ("all_reduce", "reduce", "all_gather", "barrier")
    ]
    items = {}
    for _, e in steps:
        for at in e["items"]:
            items[at] = items.get(at, 0) + 1
    every_step += [f".item() at {f.code(at)}" for at, count in items.items() if count >= 0.9 * n]
    if every_step:
        return Found(f"a host sync at every one of {n} steps, for logging: {'; '.join(every_step)}")
    return None


def reduced_sites(f):
    colls = f.job.records("coll", rank=min(f.job.ranks)) if f.job.ranks else []
    return sorted({e["at"] for _, e in colls if e["name"] in REDUCING}, key=by_line)


@rule(
    "DDP506",
    "warn",
    see="metrics",
    help="sum (loss x samples, samples) on each rank, then dist.all_reduce() it, once an epoch",
)
def metrics_not_reduced(f):
    """No metric is all-reduced: what rank 0 reports is its own shard's.

    Each rank computes its loss on its own shard. A loss printed by rank 0 without an
    all-reduce is an estimate from 1/N of the data. Sum (loss x samples, samples) on each rank,
    all-reduce the sums, and divide.
    """
    if f.job.records("step") and f.world > 1 and not reduced_sites(f):
        return Found("no metric is all-reduced: what rank 0 reports is its own shard's")
    return None


@summary(5)
def step_5_summary(f):
    job = f.job
    steps = job.records("step", rank=min(job.ranks)) if job.ranks else []
    if not steps:
        return "--", "not checked: no optimizer step ran"
    reduced = reduced_sites(f)
    calls = sum(1 for _, e in job.records("coll", rank=min(job.ranks)) if e["at"] in reduced)
    return (
        "ok",
        f"all-reduced at {' and '.join(reduced)}: {plural(calls, 'call')} in {plural(len(steps), 'step')}",
    )


# DDP step 6: checkpoint on rank 0


@rule(
    "DDP601",
    "FAIL",
    see="unsafe_load",
    help="save plain tensors and numbers, and load with weights_only=True (the default since torch 2.6)",
)
def unsafe_load(f):
    """torch.load(..., weights_only=False): loading such a file runs any code it names.

    A checkpoint is a pickle; with weights_only=False, unpickling it may call any function it
    names, so a file from someone else can run code on your machine. Save tensors, numbers and
    strings (state_dict(), not the model object), and load with weights_only=True.
    """
    for _, e in f.job.records("load"):
        if e["weights_only"] is False:
            return Found(
                f"{f.code(e['at'])} loads with weights_only=False: loading such a file runs any code it names"
            )
    return None


@rule(
    "DDP602",
    "FAIL",
    help="save on one rank: if dist.get_rank() == 0: torch.save(...), with no collective inside",
)
def every_rank_saves(f):
    """Every rank saves the same checkpoint file, at once.

    The replicas are equal, so one copy is all there is to save; N processes writing one file
    at the same moment may leave it torn, and on a shared folder they contend for it. Save on
    rank 0 alone (and keep any collective outside that block).
    """
    by_path = {}
    for rank, e in f.job.records("save"):
        by_path.setdefault(f.renamed.get(e["path"], e["path"]), {})[rank] = e
    for path, savers in sorted(by_path.items(), key=lambda item: str(item[0])):
        if path and len(savers) > 1:
            e = next(iter(savers.values()))
            return Found(
                f"{ranks_text(savers)} {both(savers)} saved {f.job.relpath(path)} at {f.code(e['at'])}: "
                "every rank writes the same file, at once"
            )
    return None


@rule("DDP603", "FAIL", see="wrapped_state_dict", help="save model.module.state_dict(), the model DDP wraps")
def wrapped_state_dict(f):
    """The checkpoint holds the DDP wrapper's state_dict(): every key starts with module.

    DDP keeps the model as its attribute module, so its state_dict() prefixes every key with
    "module.". Only a DDP-wrapped model loads that: the baseline, an evaluation script, or a run
    with another world size fails with missing and unexpected keys. Save model.module.state_dict().
    """
    for _, e in f.job.records("save"):
        if e["what"]["module_prefix"]:
            return Found(
                f"the model keys saved at {f.code(e['at'])} start with module.: the state_dict() of the DDP "
                "wrapper, which only a DDP model loads"
            )
    return None


@rule("DDP604", "FAIL", see="wrapped_state_dict", help="save model.module.state_dict()")
def pickles_wrapper(f):
    """The checkpoint pickles the DDP wrapper itself.

    torch.save(model) of a DDP model pickles the wrapper, with its process group: loading it
    needs the same classes, a process group, and weights_only=False. Save the state_dict() of
    the model DDP wraps.
    """
    for _, e in f.job.records("save"):
        if e["what"]["module"] == "DistributedDataParallel":
            return Found(f"{f.code(e['at'])} pickles the DDP wrapper itself")
    return None


@rule(
    "DDP605",
    "warn",
    help="write files from one rank (if dist.get_rank() == 0:), or one file per rank",
)
def several_ranks_write(f):
    """A file other than a checkpoint is written by more than one rank.

    Several processes writing one log or metrics file interleave their lines, or overwrite each
    other's. Write from one rank, or name one file per rank.
    """
    writers = {}
    for rank, e in f.job.records("write"):
        writers.setdefault(e["path"], {})[rank] = e
    for path, by in sorted(writers.items()):
        if len(by) > 1 and not path.endswith(".lock"):
            e = next(iter(by.values()))
            return Found(f"{ranks_text(by)} {both(by)} wrote {f.job.relpath(path)} at {f.code(e['at'])}")
    return None


@rule(
    "DDP606",
    "warn",
    see="compile_order",
    help="save the bare model's state_dict(): keep a reference to it before torch.compile",
)
def compiled_state_dict(f):
    """The checkpoint's keys start with _orig_mod.: a compiled model's, which only a compiled model loads.

    torch.compile wraps the model, and the wrapper's state_dict() prefixes every key with
    "_orig_mod.". Keep a reference to the bare model and save its state_dict().
    """
    saves = f.job.records("save")
    if any(s["what"]["orig_mod_prefix"] for _, s in saves):
        return Found(
            f"the model keys saved at {f.code(saves[0][1]['at'])} start with _orig_mod.: a compiled model's, "
            "which only a compiled model loads"
        )
    return None


@rule("DDP607", "warn", help="save optimizer.state_dict() too (and the epoch), and load both to resume")
def no_optimizer_state(f):
    """The checkpoint holds no optimizer state: training cannot resume exactly from it.

    Momentum and Adam's moments live in the optimizer. A run resumed from the weights alone
    restarts them from zero, and trains differently from one that never stopped. Save
    optimizer.state_dict() (and the epoch) with the model, and load both.
    """
    saves = f.job.records("save")
    if saves and not any(s["what"]["optimizer"] for _, s in saves):
        return Found(
            f"the checkpoint saved at {f.code(saves[0][1]['at'])} holds no optimizer state: training cannot "
            "resume exactly from it"
        )
    return None


@summary(6)
def step_6_summary(f):
    saves = f.job.records("save")
    if not saves:
        return "--", "not checked: the script saved nothing with torch.save()"
    names = sorted({os.path.basename(f.renamed.get(s["path"], s["path"]) or "?") for _, s in saves})
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    ranks = sorted({r for r, _ in saves})
    return "ok", (
        f"{ranks_text(ranks)} alone saved {shown} at {saves[0][1]['at']}: model and optimizer state, "
        "no module. prefix"
    )


# DDP step 7: clean up


@rule(
    "DDP701",
    "warn",
    help="on gloo, torch 2.13 can hang as a process frees its DDP model (pytorch/pytorch#190489); else "
    "something still runs as Python exits (a thread, a worker pool): end it",
)
def stuck_at_exit(f):
    """Every rank finished its script, but a process did not end.

    Something still ran as Python exited: a thread that is not a daemon, a worker pool never
    closed, or, on gloo with torch 2.13, the DDP model freed during shutdown
    (pytorch/pytorch#190489; gc.collect() after training avoids it).
    """
    job = f.job
    if not job.stuck_at_exit:
        return None
    ended = {r for r, _ in job.records("exit")}
    stuck = sorted(set(job.ranks) - ended) or sorted(job.ranks)
    freeing = all(job.records("ddp_freed", rank=r) for r in stuck)
    return Found(
        f"every rank finished training, but {ranks_text(stuck)} did not end: stopped "
        f"{job.silence + 10:g} s after the last sign of life"
        + (", while freeing the DDP model" if freeing else "")
    )


@rule(
    "DDP702",
    "warn",
    help="call dist.destroy_process_group() once training is done, on every rank",
)
def not_destroyed(f):
    """A rank never called dist.destroy_process_group() at the end.

    The process group holds connections and, on GPUs, nccl's communicators; without
    destroy_process_group() they are torn down as Python exits, in no particular order, which
    can hang a process or print errors after a run that went well.
    """
    job = f.job
    destroyed = {r for r, _ in job.records("destroy")}
    if destroyed and len(destroyed) == len(job.ranks):
        return None
    if job.hung or f.crash or job.returncode or not job.records("met"):
        return None  # not checked: the job did not finish, or made no group
    missing = sorted(set(job.ranks) - destroyed)
    return Found(
        f"{ranks_text(missing) if destroyed else 'no rank'} called dist.destroy_process_group() at the end"
    )


@summary(7)
def step_7_summary(f):
    job = f.job
    destroyed = {r: e for r, e in job.records("destroy")}
    if destroyed and len(destroyed) == len(job.ranks):
        return "ok", f"every rank destroyed its process group at {next(iter(destroyed.values()))['at']}"
    if job.hung or f.crash or job.returncode:
        return "--", "not checked: the job did not finish"
    return "--", "not checked: no process group was made"


# DDP step 8: launch with torchrun


@rule(
    "DDP801",
    "FAIL",
    explains=("crash",),
    help="drop mp.spawn: run the training function once, reading RANK, LOCAL_RANK and WORLD_SIZE from the "
    "environment torchrun makes; launch with torchrun",
)
def starts_own_processes(f):
    """The script starts its own processes (mp.spawn) under torchrun.

    torchrun already starts one process per GPU. A script that spawns its own from each of them
    makes N x N processes for a world of N, each group of which tries to meet on its own: they
    hang, or fight over the port. Run the training function once per process, reading who it
    is from the environment torchrun made.
    """
    spawns = f.job.records("spawn")
    if spawns:
        return Found(
            f"{f.code(spawns[0][1]['at'])} starts its own processes: under torchrun each of the "
            f"{len(f.job.ranks)} processes is already one of the job's, and would start a job of its own"
        )
    return None


@rule(
    "DDP802",
    "FAIL",
    explains=("crash",),
    help='pick the backend from the device: "nccl" if torch.cuda.is_available() else "gloo"',
)
def nccl_without_gpu(f):
    """The script asks for nccl, and this machine has no GPU.

    nccl moves tensors between GPUs only. On a machine without GPUs the group cannot be made.
    Pick the backend from the device: nccl on GPUs, gloo on CPUs.
    """
    if f.job.device == "cpu":
        for _, e in f.job.records("init"):
            if "nccl" in e["backend"].lower():
                return Found(f"{f.code(e['at'])} needs a GPU (nccl), and this machine has none")
    return None


def needs_gpu(event):
    return bool(
        event
        and re.search(r"CUDA|NVIDIA|NCCL|nccl|cuda|GPU", event["message"])
        and "SyncBatchNorm" not in event["message"]
        and not re.search(r"out of memory", event["message"])
    )


@rule(
    "DDP803",
    "FAIL",
    explains=("crash",),
    help="choose the device from what there is: torch.device('cuda', local_rank) if "
    "torch.cuda.is_available() else torch.device('cpu'), and gloo on a CPU",
)
def cuda_without_gpu(f):
    """The script needs a GPU, and this machine has none.

    A CUDA call (torch.cuda.set_device, .cuda(), a cuda device) fails where there is no GPU.
    Choose the device from what there is, so that the script also runs on a CPU.
    """
    if f.job.device == "cpu" and f.crash and needs_gpu(f.crash[1]):
        e = f.crash[1]
        return Found(
            f"{f.code(e['at'])} needs a GPU, and this machine has none: {e['type']}: {short(e['message'])}"
        )
    return None


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


@rule(
    "DDP804",
    "FAIL",
    help="give the script its own arguments after its name (python check_ddp.py my_train.py ARGS); "
    "torchrun --standalone --nproc_per_node=2 my_train.py ARGS shows the whole error",
)
def stopped_before_training(f):
    """The script did not start under torchrun, or stopped before training, with no error of its own.

    The script ended (an argument missing, a file not found, a sys.exit) before any training
    step, and before any error the check could trace. Its last words are in the report; the
    job's output has the rest.
    """
    job = f.job
    quit_early = job.returncode and not (f.crash or job.hung or job.stuck_at_exit or job.records("step"))
    if job.ranks and not quit_early:
        return None
    said = script_said(job) or f"exit {job.returncode}"
    return Found(
        f"the script {'did not start' if not job.ranks else 'stopped before training'} under torchrun: {said}"
    )


@summary(8)
def step_8_summary(f):
    return "ok", f"torchrun ran it as written, {len(f.job.ranks)} processes"


# DDP step 9: accumulate gradients with no_sync


def accumulating(f):
    return [e for _, e in f.job.records("step") if e["backward"] > 1 and f.job.records("ddp")]


@rule(
    "DDP901",
    "warn",
    see="no_sync",
    help="wrap the first K-1 in model.no_sync(): the gradients then add up locally, and only the last "
    "backward all-reduces them",
)
def accumulation_without_no_sync(f):
    """Gradient accumulation without no_sync(): every micro-batch's backward all-reduces.

    With K micro-batches an optimizer step, only the last backward needs to all-reduce the
    accumulated gradients. Without model.no_sync() around the first K-1, DDP all-reduces after
    each one: K times the communication, for the same result.
    """
    steps = accumulating(f)
    if not steps:
        return None
    k = max(e["backward"] for e in steps)
    synced = max(e["synced"] for e in steps)
    if synced > 1:
        return Found(
            f"{k} backward passes make each optimizer step, and {synced} of them all-reduce their gradients",
            help=f"wrap the first {k - 1} in model.no_sync(): the gradients then add up locally, and only "
            "the last backward all-reduces them",
        )
    return None


@summary(9)
def step_9_summary(f):
    steps = accumulating(f)
    if not steps:
        return None  # no accumulation: no line
    k = max(e["backward"] for e in steps)
    return "ok", f"{k} micro-batches an optimizer step; only the last backward all-reduces (no_sync)"


# DDP step 10: evaluate exactly


@rule(
    "DDP1001",
    "FAIL",
    explains=("crash",),
    help="evaluate the bare model, model.module, under torch.no_grad(): it needs no other rank",
)
def evaluated_through_ddp_alone(f):
    """A rank evaluated through the DDP model while the others did not: DDP's forward waits for them.

    DDP's forward() can take part in collectives (it syncs buffers such as BatchNorm's running
    statistics from rank 0). Evaluating through it on rank 0 alone leaves rank 0 waiting for
    ranks that are not there. Evaluate the bare model, model.module.
    """
    if f.crash and f.crash[1].get("loader") in f.evaluation:
        rank, e = f.crash
        if e.get("call") == DDP_FORWARD and COMMUNICATION_ERROR.search(e["message"]):
            return Found(
                f"rank {rank} evaluated through the DDP model at {f.code(e['at'])} while the other ranks did "
                f"not: DDP's forward waits for them ({short(e['message'])})"
            )
    return None


@rule(
    "DDP1002",
    "warn",
    help="for an exact number, let every rank evaluate its shard of the held-out set, then all-reduce "
    "(sum, count)",
)
def evaluated_alone(f):
    """Rank 0 alone evaluated: its held-out number comes from its own batches, not the held-out set.

    An evaluation done by one rank, on the batches it happens to have, estimates the held-out
    metric from a part of it. For the exact number, let every rank evaluate its shard of the
    held-out set, and all-reduce (sum, count).
    """
    if f.evaluation:
        return None
    through_ddp = {r: e["evaluations"] for r, e in f.job.records("exit")}
    alone = sorted(r for r, n in through_ddp.items() if n)
    if len(through_ddp) == f.world > 1 and len(alone) == 1:
        return Found(
            f"rank {alone[0]} alone evaluated ({through_ddp[alone[0]]} forwards without gradients through "
            "the DDP model, none on the other ranks): its held-out number is an estimate from its own "
            "batches, not the held-out set"
        )
    return None


def crashed_in_evaluation(f):
    return f.crash is not None and f.crash[1].get("loader") in f.evaluation


@rule(
    "DDP1003",
    "FAIL",
    see="metrics",
    help="sum (loss x samples, samples) and correct counts on each rank, then dist.all_reduce() them before "
    "dividing",
)
def evaluation_not_reduced(f):
    """Each rank evaluated only its shard of the held-out set, and no collective followed.

    With a DistributedSampler on the held-out set, each rank sees 1/N of it; the metric each
    rank then reports is its shard's alone, and differs from rank to rank. Sum (loss x samples,
    samples, correct) on each rank and all-reduce the sums before dividing.
    """
    if not crashed_in_evaluation(f) and f.evaluated and f.evaluated[0] == "unreduced":
        at = f.evaluated[2]
        return Found(
            f"each rank evaluated only its own shard of the held-out set (DataLoader at {f.code(at)}), and "
            "no collective followed: the held-out metric each rank has is its shard's alone"
        )
    return None


@rule(
    "DDP1004",
    "warn",
    help="give rank r the samples range(r, len(dataset), world_size), then all-reduce (sum, count)",
)
def evaluation_padded(f):
    """The held-out shards repeat samples: DistributedSampler pads them, so a mean counts those twice.

    DistributedSampler makes every shard the same size by repeating samples when N does not
    divide the dataset. For training that is harmless; for an exact held-out metric the
    repeats count twice. Give rank r the samples r, r + N, ..., and all-reduce (sum, count).
    """
    if not crashed_in_evaluation(f) and f.evaluated and f.evaluated[0] == "padded":
        _, _, at, union, repeats = f.evaluated
        return Found(
            f"the held-out shards repeat {repeats} of {union} samples (DataLoader at {f.code(at)}): "
            "DistributedSampler pads them, so a mean counts those twice"
        )
    return None


@summary(10)
def step_10_summary(f):
    if crashed_in_evaluation(f) or not f.evaluated:
        return None  # no evaluation; or the script's own error in it, reported as such in this step
    how, _, at, union, _ = f.evaluated
    if how == "all":
        return "ok", (
            f"every rank evaluated all {union} held-out samples (DataLoader at {at}): exact, and "
            f"{f.world} times the work"
        )
    return (
        "ok",
        f"each rank evaluated its own shard, then all-reduced: {union} held-out samples, each once "
        f"(DataLoader at {at})",
    )


# a crash that no rule above explains: at the step the rank was in


@rule(
    "DDP000",
    "FAIL",
    explains=("crash",),
    help="the script's own error; torchrun then stopped every rank. Its traceback is in the job's output "
    "(below)",
)
def crashed(f):
    """The script stopped with an error of its own.

    A rank raised an error that none of the other findings explains; torchrun then stopped every
    rank. The report gives the error and the script's line that raised it, under the step the
    rank was in; the job's output has the whole traceback.
    """
    rank, event = f.crash
    error = f"{event['type']}: {short(event['message'])}"
    return Found(f"rank {rank} stopped with an error at {f.code(event['at'])}: {error}")


# -----------------------------------------------------------------------------
# 4. report: a line per step, details only where they help, the verdict last


def pitfall_path(key):
    """Where the pitfall program is, beside this file, as the reader finds it from here; None
    where this file was copied alone."""
    path = Path(__file__).resolve().parent / PITFALLS[key]
    if not path.is_file():
        return None
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else str(path)


def see(line):
    """Where to read more about a finding: its pitfall, if it is here, and its explanation."""
    explanation = f"python check_ddp.py --explain {line.code}"
    pitfall = pitfall_path(line.see) if line.see else None
    return f"{pitfall}; {explanation}" if pitfall else explanation


def report(job, lines):
    width = 100
    out = [
        f"check_ddp: {' '.join(job.command)}  ({len(job.ranks) or job.nproc} processes, "
        f"{'GPUs, nccl' if job.device == 'cuda' else 'CPU, gloo'}; {job.seconds:.1f} s)"
    ]
    for line in lines:
        head = f"step {line.step:<2} {line.verdict:<5} "
        indent = " " * len(head)
        out.append(
            textwrap.fill(
                f"{STEPS[line.step]}: {line.message}", width, initial_indent=head, subsequent_indent=indent
            )
        )
        if line.verdict in ("FAIL", "warn"):
            out.append(
                textwrap.fill(
                    line.help, width, initial_indent=indent + "help: ", subsequent_indent=indent + " " * 6
                )
            )
            out.append(f"{indent}see:  {see(line)}")  # whole, to copy
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
