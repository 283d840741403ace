"""Check a DDP training script by running it: one line per DDP step, ok, warn or FAIL, with evidence.

    python check_ddp.py my_train.py                    # your script, with its own defaults
    python check_ddp.py my_train.py --epochs 2         # and with its own arguments
    python check_ddp.py --nproc 4 --silence 60 my_train.py
    python check_ddp.py --explain DDP305               # what a finding means, and what to do
    python check_ddp.py --judge /tmp/check_ddp-XXXX    # a job already run, judged again

It starts your script as a small job, `torchrun --standalone --nproc_per_node=2 my_train.py ...`,
watches every process from the inside without changing your script, and reports on the steps
of README.md: what each rank did (the sampler's indices, the model's wrapper, the collectives,
the files written, the weights at the end), where (your file:line), what to do, and the
pitfall that shows the mistake. Its own options come before the script; everything after the
script is the script's. The job runs for real, in this folder: it writes what your script
writes.

Where there are as many GPUs as processes, the job runs on them. Elsewhere (a laptop, a CI
runner, a machine of one GPU, or --cpu) a GPU script runs unchanged on the CPU: CUDA and NCCL
are stood in (cuda -> cpu, nccl -> gloo; each GPU the script asks for is recorded, with its
line), and the processes are shown as two nodes of one GPU each (--nnodes), so that RANK and
LOCAL_RANK differ on the second node, as they do on a real multi-node job.

Exit status: 0 when no step failed (warnings included), 1 when one did or the script stopped with
an error of its own, 2 for a usage error (a silencing comment that names no code among them), 3 when
check_ddp's own error made the check incomplete (never your script's).
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
   2b. the stand-in (without GPUs): one StandIn object, with its own state (the node's GPUs,
   where each tensor would be), puts CPU versions of CUDA and NCCL in torch's place, declared
   in WRAPPERS as the watcher's wrappers are (@stands_in, @replaces), and applied first. It
   says what it stood in for in records of its own; the watcher never reads its state.
3. judge: Facts reads a job's records and derives, once, what several rules need (the loaders'
   passes, the crash, where each rank waits); Source reads the script's code as the job saw it,
   for what the run did not show (a load never reached, the if around a call). Each RULES entry
   is one finding: a code (DDP3xx for step 3), its verdict, its help, and its docstring, the
   explanation --explain prints. For each step, the first rule that finds something (and that
   the script does not silence: # check_ddp: ignore[CODE]) is the step's line; else the step's
   summary says ok, or -- for not checked.
4. report: a line per step, the script's own error after them, the verdict last.

How to add a check:
1. If the records do not show it yet, record it in a wrapper (@watches, or the stand-in's
   @stands_in): a new kind of record goes into SCHEMA, a new field of a kind into OPTIONAL with
   the value an older record means (so that jobs recorded before it still judge as they did; a
   new kind changes recorder(), the digest --judge compares, and every recorded job must be
   recorded again). A private name of torch's the wrapper reads goes into PRIVATE.
2. Write the rule (@rule) under its step's banner, at its place in ORDER (the order the step's
   rules are tried in: a cause before its symptoms, a FAIL before a warn of the same evidence),
   its docstring saying what happens, why, and what to do (--explain prints it). A finding is
   filed by the call that caused it and the data it touched, never by the phase the job was in;
   what the run did not reach, read from the script's code (Facts.source) or exercised where it
   is cheap. One cause, one FAIL: what follows from it says so (Found's follows; launch=).
3. Add a case to tests/check_ddp_cases/ whose first line names the code
   (tests/check_ddp_cases/README.md), and record its job: python tests/record_check_ddp_jobs.py
   CASE (a rule's new wording needs only --reports).
"""

import argparse
import ast
import collections
import contextlib
import functools
import importlib
import importlib.util
import inspect
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import threading
import time
import types
import weakref
from dataclasses import dataclass
from pathlib import Path

SCRIPT = 0  # the line of the script's own error, which is no DDP step's (DDP000), after the steps
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
    "master_port": "pitfalls/step1_hardcoded_master_port.py",
    "global_rank_device": "pitfalls/step2_global_rank_as_device.py",
    "set_epoch": "pitfalls/step3_missing_set_epoch.py",
    "uneven": "pitfalls/step3_uneven_inputs.py",
    "unseeded": "pitfalls/step3_unseeded_dataset.py",
    "compile_order": "pitfalls/step4_compile_and_ddp_order.py",
    "unused_parameter": "pitfalls/step4_unused_parameter.py",
    "metrics": "pitfalls/step5_metric_averaging.py",
    "rank_zero_collective": "pitfalls/step6_collective_on_rank_zero.py",
    "unsafe_load": "pitfalls/step6_unsafe_torch_load.py",
    "wrapped_state_dict": "pitfalls/step6_wrapped_state_dict.py",
    "notebook": "pitfalls/step8_ddp_inside_a_notebook_cell.py",
    "no_sync": "pitfalls/step9_accumulation_without_no_sync.py",
    "early_stop": "pitfalls/step10_early_stop_on_one_rank.py",
    "every_rank_saves": "pitfalls/step6_every_rank_saves.py",
    "optimizer_before_shard": "pitfalls/fsdp_step4_optimizer_before_fully_shard.py",
    "full_state_dict_rank_zero": "pitfalls/fsdp_step6_full_state_dict_on_rank_zero.py",
    "sharded_state_dict": "pitfalls/fsdp_step6_sharded_state_dict_saved_by_rank_zero.py",
    "fsdp_eval_alone": "pitfalls/fsdp_step10_evaluate_on_rank_zero.py",
}
LAUNCH_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE")
# In a run again with the script's own launch set aside (see set_aside): its writes of LAUNCH_VARIABLES
# and its init_process_group() rendezvous (init_method, rank, world_size, store) are recorded, and not
# made: torchrun's stand, so that the rest of the script can be checked
KEEP_LAUNCH = os.environ.get("CHECK_DDP_KEEP_LAUNCH") == "1"


def main(argv=None):
    if hasattr(signal, "SIGPIPE"):  # a report piped into head ends quietly, as other tools' do
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    parser = argparse.ArgumentParser(
        prog="check_ddp.py",
        description=__doc__.splitlines()[0],
        epilog="Options go before the script; what follows the script is passed to it. The report has a "
        "line per DDP step: ok, warn, FAIL, or -- (not checked: the job did not show it, or it follows from "
        "another step's FAIL). Exit status: 0 no step failed, 1 a step failed or the script stopped with "
        "its own error, 2 a usage error, 3 "
        "check_ddp's own error (not your script's). The job runs in this folder, and leaves there what your "
        "script writes.",
    )
    parser.add_argument("--nproc", type=int, default=2, help="processes to start (default: 2)")
    parser.add_argument(
        "--silence",
        type=float,
        default=20,
        help="seconds without progress after which the job is stopped as hung (default: 20)",
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="run on the CPU even where there are GPUs: CUDA and NCCL stood in, as where there are too few",
    )
    parser.add_argument(
        "--nnodes",
        type=int,
        help="nodes to show the processes as, as many processes on each (default: 2 on the CPU, or one a "
        "process for an odd number; 1 on GPUs)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show the job's own output as it runs")
    parser.add_argument(
        "--explain",
        nargs="?",
        const="",
        metavar="CODE",
        help="explain what a finding's code means (alone: list every code); runs nothing",
    )
    parser.add_argument(
        "--judge",
        metavar="FOLDER",
        help="judge again the job a check left in FOLDER (or its output.log, as the report's last line names "
        "it); runs nothing",
    )
    parser.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="the report as text (default), or as JSON: each DDP step's finding with its verdict, code, "
        "message, file:line, help and see, for editors and CI",
    )
    parser.add_argument("script", nargs="?", help="your training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its own arguments")
    options = parser.parse_args(argv)
    if options.explain is not None:
        text = explain(options.explain)
        if text is None:
            parser.error(f"{options.explain}: no such code ({explain_command()} lists them)")
        print(text)
        return 0
    if options.judge:
        folder = Path(options.judge)
        folder = folder.parent if folder.is_file() else folder  # .../output.log, as the report names it
        if not (folder / "job.json").is_file():
            parser.error(f"{options.judge}: not the folder of a job (it has no job.json)")
        made, ours = Job.made_by(folder), (FORMAT, recorder())
        if made != ours:  # not a mistake in the command: one line, no usage
            print(
                f"check_ddp.py: {options.judge}: recorded by another version of check_ddp.py (format "
                f"{made[0]}, recorder {made[1]}; this one's: {ours[0]}, {ours[1]}): check the script again "
                "with this one",
                file=sys.stderr,
            )
            sys.exit(2)
        job = Job.load(folder)
    else:
        if options.script is None:
            parser.error("name your training script: python check_ddp.py my_train.py [its args]")
        if not Path(options.script).is_file():
            parser.error(f"{options.script}: no such file")
        unknown = unknown_ignores(Path(options.script).read_text(errors="replace"))
        if unknown:  # before the job runs: a silencing comment must name a code
            line, code = unknown[0]
            parser.error(
                f"{options.script}:{line}: # check_ddp: ignore[{code}] names no code of check_ddp's "
                f"({explain_command()} lists them)"
            )
        if options.nproc < 2:
            parser.error("--nproc must be at least 2: one process cannot share anything")
        if options.silence <= 0:
            parser.error("--silence must be more than 0 seconds")
        if options.nnodes is not None and (options.nnodes < 1 or options.nproc % options.nnodes):
            parser.error(f"--nnodes must divide --nproc ({options.nproc}): as many processes on each node")
        job = run_job(options)
        last, aside = job, set()
        # a job stopped by a mistake the check can set aside (its own launch variables over torchrun's,
        # a GPU index that only the rehearsed layout lacks): checked again without it, so that what the
        # mistake hid is checked too; the report gives both
        while (more := set_aside(options, last) - aside) and len(aside) < 2:
            aside |= more
            then = run_job(options, aside=aside)
            shutil.move(str(then.folder), last.folder / "then")
            last.then = "then"
            last.save()
            last = Job.load(last.folder / "then")
        job = Job.load(job.folder)
    lines = judge(job)
    failed = any(line.verdict == "FAIL" for line in lines)
    # 2: a silencing comment that names no code is a usage error (never a silence)
    status = 2 if job.unknown_ignores else 3 if own_errors(job) else 1 if failed else 0
    # 3: the check itself failed, and whatever it found is incomplete
    print(
        json.dumps(as_json(job, lines, status), indent=1) if options.format == "json" else report(job, lines)
    )
    return status


# -----------------------------------------------------------------------------
# 1. run: torchrun, with a watcher in each of its processes; the job's folder


class Job:
    """What a run of the script left in its folder, all the judge reads: each rank's records
    (rank<R>.jsonl), the job's output (output.log), and how it ended (job.json: the command,
    the device, exit status, seconds, whether it hung or stuck at exit, the folder it ran in,
    and the text of the script's files that the records cite)."""

    ENDING = (
        "command", "nproc", "nnodes", "silence", "device", "cwd", "returncode", "seconds", "hung",
        "stuck_at_exit", "then", "aside",
    )  # fmt: skip

    def __init__(self, folder, command, nproc, nnodes, silence, device, cwd):
        self.folder, self.command, self.nproc, self.nnodes = Path(folder), command, nproc, nnodes
        self.silence, self.device, self.cwd = silence, device, cwd  # device: cuda, or cpu (stood in)
        self.ranks = {}  # rank: its records, in order
        self.output = ""
        self.returncode = None
        self.seconds = 0.0
        self.hung = False  # stopped after --silence seconds without progress
        self.stuck_at_exit = False  # every rank finished its script, but a process did not end
        self.sources = {}  # a file the records cite (as they cite it): its text
        self.then = None  # the subfolder of the same job run again with what stopped it set aside
        self.aside = []  # what this run set aside ("launch", "layout"): see set_aside()
        self.judge_errors = []  # rules of check_ddp's own that failed on this job (own_errors)
        self.ignored = []  # findings the script silences (# check_ddp: ignore[CODE]): (code, file:line, step)
        self.unknown_ignores = []  # silencing comments that name no code: (file:line, what they name)

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
        self.ranks = {r: [with_defaults(e) for e in events] for r, events in self.ranks.items()}

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
                for path in re.findall(r'File "([^"]+)", line', e.get("message") or ""):  # a child's
                    cited.add(os.path.relpath(path, self.cwd))
                cited.update(e.get("files") or ())  # every file of the script's it imported
        script = next((a for a in self.command[1:] if a.endswith(".py")), None)
        if script:
            cited.add(
                os.path.relpath(os.path.join(self.cwd, script), self.cwd)
            )  # its code that never ran too
        self.sources = {path: text for path in sorted(cited) if (text := self.source(path)) is not None}
        ending = {name: getattr(self, name) for name in self.ENDING}
        made = {"format": FORMAT, "recorder": recorder()}
        (self.folder / "job.json").write_text(
            json.dumps({**made, **ending, "sources": self.sources}, indent=1)
        )

    @staticmethod
    def made_by(folder):
        """(format, recorder) of the check_ddp.py that recorded the job in folder."""
        saved = json.loads((Path(folder) / "job.json").read_text())
        return saved.get("format", 1), saved.get("recorder")

    @classmethod
    def load(cls, folder):
        saved = json.loads((Path(folder) / "job.json").read_text())
        job = cls(
            folder, *(saved[name] for name in ("command", "nproc", "nnodes", "silence", "device", "cwd"))
        )
        for name in cls.ENDING:
            setattr(job, name, saved.get(name, getattr(job, name)))
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


def set_aside(options, job):
    """What stopped the job that a run could set aside: "launch", the script's own launch variables
    and init_process_group() arguments over torchrun's (torchrun's are kept); "layout", a GPU index
    only the rehearsed nodes lack (one node of all the processes); nothing if the job did not stop."""
    if not (job.hung or job.returncode):
        return set()
    found = {RULES[x.code].sets_aside for x in judge_one(job) if x.verdict == "FAIL" and x.code in RULES}
    if options.nnodes is not None or job.nnodes == 1:
        found.discard("layout")
    return found - {None}


def run_job(options, aside=()):
    gpus = visible_gpus(options)
    device = "cuda" if gpus >= options.nproc else "cpu"
    # on the CPU, two nodes (or, for an odd number of processes, a node each), so that RANK and
    # LOCAL_RANK differ; on GPUs, the one machine they are on
    rehearsed = (2 if options.nproc % 2 == 0 else options.nproc) if device == "cpu" else 1
    nnodes = 1 if "layout" in aside else options.nnodes or rehearsed
    folder = Path(tempfile.mkdtemp(prefix="check_ddp-"))
    site = folder / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = dict(os.environ, CHECK_DDP_FOLDER=str(folder), CHECK_DDP_TOOL=str(Path(__file__).resolve()))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    env["CHECK_DDP_NNODES"] = str(nnodes)
    if "launch" in aside:  # the script's own launch variables and init arguments set aside: torchrun's kept
        env["CHECK_DDP_KEEP_LAUNCH"] = "1"
    if device == "cpu":  # --cpu, or fewer GPUs than processes: the CPU, as on a laptop, CUDA stood in
        env.update(CUDA_VISIBLE_DEVICES="", CHECK_DDP_STANDIN="1")
    else:  # each rehearsed node its own GPUs: those CUDA_VISIBLE_DEVICES lists, in order, or all
        listed = os.environ.get("CUDA_VISIBLE_DEVICES")
        env["CHECK_DDP_GPUS"] = listed if listed else ",".join(map(str, range(gpus)))
    launch = ["--standalone", f"--nproc_per_node={options.nproc}"]
    command = [sys.executable, "-m", "torch.distributed.run", *launch, options.script, *options.args]
    job = Job(
        folder, ["torchrun", *launch, options.script, *options.args], options.nproc, nnodes, options.silence,
        device, os.getcwd(),
    )  # fmt: skip
    job.aside = sorted(aside)
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
    # a process starts: who torchrun says it is (on the node check_ddp shows it), whether CUDA and
    # NCCL are stood in on the CPU, and the GPUs its node has
    "start": (
        "rank",
        "local_rank",
        "world_size",
        "node",
        "local_world_size",
        "standin",
        "cuda",
        "gpus",
        "torch",
        "env",
    ),
    # twice a second: the watched call the main thread is in (a CALLS key, or None), the script's
    # lines it came from (innermost first), the innermost frame of all
    "now": ("call", "stack", "inner"),
    # step 1: the script writes a launch variable over torchrun's; calls init_process_group (what
    # it passed); the group is made (what it is); destroy_process_group() of the whole group
    "env": ("key", "value", "torchrun", "at"),
    "init": ("at", "backend", "init_method", "rank", "world_size", "store"),
    "met": ("seconds", "rank", "world_size", "backend"),
    "destroy": ("at",),
    # the script (or a library) reads a launch variable, or parses an option named like one
    # (--local_rank, which torchrun never passes): its value, its default, whether it was given
    "read": ("key", "by", "at", "found"),
    "arg": ("option", "value", "default", "given", "at"),
    # step 2, the stand-in's own: a GPU the script asks for (how: set_device, to, cuda, a factory's
    # device=, device_ids, device_id, ...), once per way and line; where the first batch of a model
    # the script put on a GPU is (cuda:N, or cpu), and where the model is (once a model, and once a
    # DDP model); the GPUs of the model a DDP model wraps, or of a model sharded, as the script put it
    # (its "ddp" or "shard" record says where it really is: the CPU)
    "gpu": ("how", "index", "at"),
    "input": ("device", "model", "at"),
    "ddp_gpus": ("at", "devices"),
    # steps 5, 6, 9: a collective the script called itself, after `step` optimizer steps
    "coll": ("name", "at", "step"),
    # step 3: a DataLoader made (its dataset's length and a fingerprint of its data; its
    # DistributedSampler's settings, or false); a pass over it begins (whether gradients are on,
    # whether a DDP model is in eval mode); a batch of it (the dataset indices it holds, or for an
    # iterable dataset a fingerprint of its data)
    "loader": ("id", "at", "dataset", "length", "batches", "data", "sampler", "distributed"),
    "pass": ("loader", "n", "at", "grad", "eval"),
    "end": ("loader", "batches", "backward"),  # a pass over (the loader ran out): batches, backward passes
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
    # a model sharded (FSDP): fully_shard() on a module (FSDP2), or FullyShardedDataParallel(...) (FSDP1):
    # its class, its parameters (the rank's local shards: their count, and their values summed, as
    # sharded, before training), over how many ranks
    "shard": ("at", "how", "module", "parameters", "local", "ranks", "devices"),
    # an optimizer made, where (the script's line that made it), and how many tensors it steps
    "optim": ("at", "tensors"),
    "step": ("n", "backward", "synced", "forward", "items", "loader"),
    # step 10: the first forward without gradients since the last optimizer step (through the DDP
    # model, or the model it wraps), and the loader that gave the last batch
    "eval": ("at", "loader"),
    "compile": ("how", "at", "wraps_ddp", "target"),
    # step 6: torch.save (where, what it holds: describe_checkpoint), torch.load, a state_dict loaded
    # into a model (a DDP model or not; its keys all start with module.), any file written
    "save": ("path", "at", "what"),
    "load_state": ("into", "ddp", "prefixed", "at"),
    "load": ("path", "at", "weights_only", "map_location"),
    "write": ("path", "at", "how", "source"),
    # step 8: the script starts processes of its own, to train in (how: spawn, a Process)
    "spawn": ("how", "at"),
    # the script's own uncaught error: where (and whether the script's own line raised it), in
    # which watched call (CALLS key), in which loader
    "crash": ("type", "message", "at", "by_script", "call", "loader"),
    # this file's own error, in its bookkeeping: caught, and never passed on to the script (once a
    # place); `at` is this file's line
    "fault": ("type", "message", "at"),
    # the process ends: its replicas' weights summed, each training forward's input summed, the
    # graphs torch.compile made, its optimizer steps, its forwards through DDP without gradients
    "exit": ("weights", "inputs", "graphs", "steps", "evaluations"),
}


# Fields added to a kind after jobs were recorded with it: each with the value an older record means.
# A new field goes here, so that jobs recorded before it still load (and judge) as they did.
OPTIONAL = {
    # the crash: who raised it: "raise" (a raise or assert statement of the script's), "call" (a call
    # the script made, inside torch or a library), "checker" (this file's own code); the file its error
    # names (an OSError's filename); the program the script ran that this machine lacks (subprocess's
    # FileNotFoundError); whether the script's own code ran inside the watched call (a model's forward
    # inside DDP's, a dataset's __getitem__ inside the DataLoader's) and raised there, or below it
    "crash": {"raised": "call", "path": None, "program": None, "within": None},
    # a collective on a group of some ranks only (their global ranks), not the whole job's
    "coll": {"group": None},
    # DDP forwards with gradients that prepared the all-reduce of their backward (DDP decides it at
    # forward time, from require_backward_grad_sync): how many of the step's did, and whether its last
    # did (that one's all-reduce carries every micro-batch's gradients, accumulated)
    "step": {"prepared": None, "last": None},
    # at the end: each forward without gradients' first input, summed (as training's inputs are): what
    # each rank evaluated, to compare between ranks; the files this rank wrote that are empty (nothing in
    # them to tear: a lock, a marker); the script's own Python files it imported (their code is read for
    # what the run did not reach); the local shards of the last model sharded, summed as at its shard
    # record (None: no model was sharded)
    "exit": {"eval_inputs": [], "empty": None, "files": None, "sharded": None},
    # a file written: "overwrite" (opened to write from its start, or renamed into place), "append";
    # a folder made: "create"
    "write": {"mode": None},
    # a checkpoint saved to a file, read back as torch.load(weights_only=True) reads it: the globals it
    # would refuse (torch.serialization.get_unsafe_globals_in_checkpoint; [] for none, None: not known),
    # and where in the saved object the first such value is, with its type ("['args']: argparse.Namespace")
    "save": {"unsafe": None, "unsafe_at": None},
    # a file loaded: whether its folder is one anyone on the machine may write to (/tmp, say)
    "load": {"shared": None},
    # a DataLoader over a Subset (a split): a fingerprint of the samples of its dataset it holds
    "loader": {"subset": None},
    # a GPU the stand-in refused, as CUDA or torch would: "negative" (a negative index), "past_node" (one
    # the node lacks: "invalid device ordinal"), "invalid" (a device torch.device() cannot parse)
    "gpu": {"refused": None},
    # a forward without gradients through a sharded model ("sharded": it all-gathers, a collective), or
    # not (None: through DDP, or the model DDP wraps)
    "eval": {"through": None},
}


def check_record(event):
    """Refuse a record that does not fit SCHEMA (the tests turn this on: CHECK_DDP_STRICT=1)."""
    kind = event.get("e")
    fields = set(event) - {"e"}
    if kind not in SCHEMA or not set(SCHEMA[kind]) <= fields <= set(SCHEMA[kind]) | set(
        OPTIONAL.get(kind, ())
    ):
        raise ValueError(f"check_ddp: a record that does not fit SCHEMA[{kind!r}]: {event}")


# What a job folder is, for the judge that reads it: FORMAT, the layout of job.json and the records
# (raised by hand when it changes), and recorder(), a digest of what is recorded: the record kinds and
# their fields (OPTIONAL's left out: a field added with its default keeps older jobs readable) and the
# calls watched. A folder made by another recorder is not judged (--judge says so): its records may
# lack what today's rules read, or hold what they no longer mean.
FORMAT = 2


def recorder():
    import hashlib

    watched = sorted(f"{w.key}:{w.standin}" for w in WRAPPERS)
    text = json.dumps({"format": FORMAT, "schema": SCHEMA, "watched": watched}, sort_keys=True)
    return hashlib.blake2b(text.encode(), digest_size=6).hexdigest()


def with_defaults(event):
    """A record as today's judge reads it: a field it was recorded without gets its default."""
    missing = OPTIONAL.get(event["e"], {}).keys() - event.keys()
    return {**event, **{name: OPTIONAL[event["e"]][name] for name in missing}} if missing else event


class Beside:
    """What the watcher knows of one of the script's objects (a DataLoader, its iterator, a model, a
    tensor), kept beside it, by its identity, for as long as it lives: never on it, where it would
    travel into the script's own copies, pickles and checkpoints."""

    def __init__(self):
        self.table = {}

    def get(self, thing, default=None):
        entry = self.table.get(id(thing))
        return entry[1] if entry is not None and entry[0]() is thing else default

    def set(self, thing, value):
        key = id(thing)
        forget = functools.partial(self.table.pop, key, None)
        self.table[key] = (weakref.ref(thing, lambda _: forget()), value)
        return value


class Quietly:
    """`with Quietly(w):` around the watcher's own bookkeeping. Whatever goes wrong in it is this file's
    error, not the script's: recorded as a fault (once a place), and never passed on to the script,
    which goes on as if it were not watched."""

    __slots__ = ("w",)

    def __init__(self, w):
        self.w = w

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if kind is None or not issubclass(kind, Exception):
            return False
        with contextlib.suppress(Exception):
            while tb.tb_next is not None:
                tb = tb.tb_next
            at = f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
            if at not in self.w.faults:
                self.w.faults.add(at)
                self.w.rec.add("fault", type=kind.__name__, message=ends(str(error)), at=at)
        return True


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
STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"])


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


def outside_stdlib():
    """The frame that called into this file, past the standard library's own frames (os.getenv,
    argparse's parse_args): whose code asked, the script's or a library's."""
    frame = callers_frame()
    while frame is not None and os.path.realpath(frame.f_code.co_filename).startswith(STDLIB):
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


# the files torch runs while it compiles, and only then: dynamo's frame conversion, inductor's compilation,
# AOT autograd's (the backward's graph, compiled at the first backward)
COMPILING = re.compile(
    r"torch[/\\](_dynamo[/\\]convert_frame|_inductor[/\\](compile_fx|codecache|graph)|_functorch[/\\]_aot_autograd)"
)


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
        # compiling: torch's compiler at work, its compile paths on the stack (not a wrapper of its on the
        # way, as torch.compiler.disable's around DDP's forward and FSDP's hooks, over a collective that
        # waits: a hang that looked busy for ever)
        compiling = compiling or COMPILING.search(frame.f_code.co_filename)
        frame = frame.f_back
    del frame
    return call, stack[:8], inner, bool(compiling)


def fingerprint(value, depth=0):
    """A short summary of data, equal on two ranks exactly when the data is (tensors, arrays,
    numbers, strings, and lists, tuples and dicts of them). It calls nothing of the script's: any
    other object is summed up by its type's name."""
    import hashlib

    import torch

    if isinstance(value, torch.Tensor):
        flat = value.detach().reshape(-1)
        step = max(1, flat.numel() // 65536)
        sample = flat[::step].cpu().contiguous()
        return f"{tuple(value.shape)}:{hashlib.blake2b(sample.numpy().tobytes(), digest_size=8).hexdigest()}"
    if type(value).__module__ == "numpy" and type(value).__name__ == "ndarray":
        return fingerprint(torch.as_tensor(value), depth)
    if type(value) in (list, tuple) and depth < 3:
        return "[" + ",".join(fingerprint(v, depth + 1) for v in value[:16]) + "]"
    if type(value) is dict and depth < 3:
        return "{" + ",".join(f"{k!r}={fingerprint(v, depth + 1)}" for k, v in list(value.items())[:16]) + "}"
    if type(value) in (int, float, bool, str, bytes, type(None)) or type(value).__module__ == "numpy":
        return repr(value)[:64]
    return type(value).__name__


def attribute(thing, name):
    """thing.name as it is stored, or None: without calling anything of the script's (no property,
    no __getattr__), as a debugger reads an object."""
    try:
        value = inspect.getattr_static(thing, name)
    except AttributeError:
        return None
    return None if hasattr(type(value), "__get__") and not callable(value) else value


def path_of(file):
    """The path a torch.save or torch.load goes to: a path, or an open file's name (io's own
    attribute); None for a buffer in memory, or an object of the script's (nothing of it is called)."""
    import io

    path = file if isinstance(file, (str, os.PathLike)) else None
    if isinstance(file, io.IOBase):
        path = getattr(file, "name", None)
    return path if isinstance(path, (str, os.PathLike)) else None


def is_torchs(thing):
    """An object of torch's own classes (a sampler, a dataset wrapper): its methods are torch's."""
    return type(thing).__module__.startswith("torch.")


def stored_data(dataset, depth=0):
    """The data a dataset holds in its attributes (tensors, arrays, lists of them, of numbers or of
    strings), read as stored."""
    import torch

    def is_data(value, depth):
        if isinstance(value, torch.Tensor) or type(value).__name__ == "ndarray":
            return True
        if type(value) in (list, tuple) and value and depth < 2:
            return is_data(value[0], depth + 1)
        if type(value) is dict and value and depth < 2:  # a sample as a dict: {"image": path, "label": path}
            return is_data(next(iter(value.values())), depth + 1)
        return depth > 0 and type(value) in (int, float, str)

    try:
        held = object.__getattribute__(dataset, "__dict__")  # as stored: no __getattr__ of the script's
    except AttributeError:
        return []
    return [v for v in dict(held).values() if is_data(v, 0)]


def stored_length(dataset):
    """The number of samples a dataset holds, read from the data it stores (its tensors' and arrays'
    first dimension, its lists' lengths) where they all agree; None where it stores none, or they differ."""
    lengths = {
        len(value) if type(value) in (list, tuple) else value.shape[0] for value in stored_data(dataset)
    }
    lengths.discard(0)
    return lengths.pop() if len(lengths) == 1 else None


def dataset_fingerprint(dataset):
    """The data a dataset holds (its tensors, arrays and lists), read as stored: None for a dataset
    that makes its samples as they are asked for. The check calls nothing of the dataset's: a
    __getitem__ may draw from a generator of the script's, or count, or cache."""
    import torch

    if (
        type(dataset) in (list, tuple)
        or isinstance(dataset, torch.Tensor)
        or type(dataset).__name__ == "ndarray"
    ):
        return fingerprint(dataset)  # a DataLoader over a list of samples (of ids, of file names): the data
    stored = stored_data(dataset)
    return fingerprint(stored) if stored else None


def describe_checkpoint(obj):
    """What a saved object holds: model state dicts (and their key prefixes), optimizer state."""
    import torch

    found = {"models": 0, "module_prefix": 0, "orig_mod_prefix": 0, "optimizer": False, "module": None}
    found["sharded"] = 0  # DTensors: a sharded model's state, this rank's shards of it

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
                found["sharded"] += sum(type(v).__name__ == "DTensor" for v in value.values())
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
    standin: bool  # part of the stand-in for CUDA and NCCL: applied only on the CPU, inside the others
    as_is: bool = False  # the stand-in's: put in place as make() returns it, not a call it wraps


WRAPPERS = []  # in the order watch() applies them
CALLS = {}  # key: Call
CALL_OF_CODE = {}  # each applied wrapper's code object: its CALLS key (to tell a frame's call)


def watches(owner, *names, step, label, compiled_through=False, standin=False):
    """Declare a wrapper of owner.name, for each name: `label` may hold {name}. A stand-in's wrapper
    (standin=True) is applied first, so that the watcher's wrapper of the same call sees what the
    script passed, and the stand-in what the CPU can run."""

    def register(make):
        for name in names:
            key = f"{owner}.{name}"
            CALLS.setdefault(key, Call(step, label.format(name=name)))
            WRAPPERS.append(Wrapper(owner, name, key, make, compiled_through, standin))
        return make

    return register


# torch's private names that the watcher and the stand-in rely on, beyond the calls they wrap: a
# module's or class's attribute ("torch.jit._builtins._get_builtin_table"), an instance's, on an
# instance made from nothing ("torch.nn.Module()._forward_pre_hooks"), or one its class's __init__ sets
# on each instance ("torch.nn.parallel.DistributedDataParallel#require_backward_grad_sync": public in
# name, not in torch's documentation, as STYLE.md has it). Each is looked up when a job
# starts (one missing is the check's fault: it says it is incomplete) and by the quick tier of the
# tests, so that a torch that renames one fails loudly, with its name, and never silences a rule.
PRIVATE = (
    "torch.jit._builtins._get_builtin_table",
    "torch._C._nn._parse_to",
    "torch.nn.modules.batchnorm._BatchNorm.forward",
    "torch.optim.optimizer.register_optimizer_step_post_hook",
    "torch.nn.Module._compiled_call_impl",
    "torch.nn.Module()._forward_pre_hooks",
    "torch.nn.Module()._forward_pre_hooks_with_kwargs",
    "torch.utils.data.DataLoader([0])._dataset_kind",
    "torch._dynamo.utils.counters",
    "multiprocessing.process.BaseProcess()._target",
    "argparse.ArgumentParser()._actions",
    "torch.utils.data.dataloader._BaseDataLoaderIter#_dataset_kind",
    "torch.nn.parallel.DistributedDataParallel#require_backward_grad_sync",
    "torch._dynamo.eval_frame.OptimizedModule#_orig_mod",
    "torch.distributed.fsdp.FullyShardedDataParallel#_fsdp_wrapped_module",
)


def missing_names(imported_only=False):
    """The names the watcher relies on that this torch (and Python) lacks: every call it wraps, and
    PRIVATE's (imported_only: only those of modules imported already: torch._dynamo takes seconds,
    and is read only if the script imported it). Empty when all are there."""
    missing = []
    for wrapper in WRAPPERS:
        try:
            if not hasattr(resolve(wrapper.owner), wrapper.name):
                missing.append(wrapper.key)
        except (ImportError, AttributeError):
            missing.append(wrapper.key)
    for name in PRIVATE:
        owner, _, attr = name.rpartition("#") if "#" in name else name.rpartition(".")
        if imported_only and owner.split("(")[0].rpartition(".")[0] not in sys.modules:
            continue
        try:
            if "#" in name:  # set by the class's __init__ on each instance: its code names it
                if attr not in resolve(owner).__init__.__code__.co_names:
                    missing.append(name)
                continue
            if owner.endswith(")"):  # an instance's, made from nothing
                made, _, given = owner[:-1].partition("(")
                thing = resolve(made)(*([json.loads(given)] if given else []))
            else:
                thing = resolve(owner)
            if not hasattr(thing, attr):
                missing.append(name)
        except (ImportError, AttributeError, TypeError):
            missing.append(name)
    return missing


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
        self.read = set()  # the launch variables already seen read
        self.state = {  # what happened since the last optimizer step
            "backward": 0,
            "synced": 0,
            "forward": 0,
            "prepared": 0,  # DDP forwards that prepared their backward's all-reduce
            "last": None,  # whether the last DDP forward did
            "items": {},
            "step": 0,
            "evaluations": 0,
            "pass": None,  # the DataLoader pass that gave the last batch
            "in_ddp": False,  # inside the DDP model's forward
            "evaluating": False,  # in a run of forwards without gradients, since the last optimizer step
        }
        self.loaders = []  # what the watcher knows of each of the script's DataLoaders, by their id
        self.of = Beside()  # the same, for each DataLoader, its iterators, and models, by identity
        self.faults = set()  # where this file's own errors were (caught, and recorded once each)
        self.live_ddp = []  # weak references to the DDP models made
        self.sharded = []  # weak references to the models sharded (FSDP), the last one the root
        self.weights = []  # the parameters of those models, or of the first optimizer: fingerprinted at exit
        self.inputs = []  # a fingerprint of each training forward's first input, kept on its device
        self.eval_inputs = []  # the same, of each forward without gradients (up to 256)
        self.written = set()  # (file, line, how) already recorded
        self.folder = os.path.realpath(os.environ["CHECK_DDP_FOLDER"])
        self.caches = os.path.realpath(os.path.expanduser("~/.cache"))

    def models(self):
        """The DDP models alive."""
        return [m for m in (ref() for ref in self.live_ddp) if m is not None]


def apply(wrapper, by, replaced):
    """Put a wrapper in place (of the watcher's, or of the stand-in's: `by`, which make() is given)."""
    owner = resolve(wrapper.owner)
    original = getattr(owner, wrapper.name, None)
    if original is None:  # this torch has no such call: never skipped in silence (missing_names)
        return
    function = wrapper.make(original, by, wrapper.name)
    if not wrapper.as_is:
        function = functools.wraps(original)(function)
        # a code object of its own, so that a frame of it names its call (wrappers share their code)
        function.__code__ = function.__code__.replace(co_name=f"{function.__code__.co_name}_{wrapper.name}")
        CALL_OF_CODE[function.__code__] = wrapper.key
    if wrapper.compiled_through:
        import torch

        function = torch.compiler.disable(function, recursive=False)
    setattr(owner, wrapper.name, function)
    replaced.append((original, function))


def watch():
    """Wrap what a DDP script calls, in this process of the job, and record what it does."""
    global TORCH_DIR
    node, node_gpus = rehearse_nodes()  # before the script, or torch, reads the environment
    import torch
    from torch.optim.optimizer import register_optimizer_step_post_hook

    TORCH_DIR = os.path.realpath(os.path.dirname(torch.__file__))
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


def keep_torchscript_builtins(replaced):
    """TorchScript knows torch's own functions (torch.zeros is aten::zeros) by what they are; a wrapper
    of one would be compiled as Python, from a source it cannot find. Each wrapper of such a function
    is the same builtin to it."""
    from torch.jit import _builtins

    table = _builtins._get_builtin_table()
    for original, wrapper in replaced:
        if id(original) in table:
            table[id(wrapper)] = table[id(original)]


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
    return node, per_node


# The wrappers, by step. Each make() returns the function that stands in for the original.

# DDP step 1: the launch variables the script writes, and the group it makes


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
            if called_by_user():
                group = signature.bind_partial(*args, **kwargs).arguments.get("group")
                some = group is not None and group is not dist.group.WORLD
                ranks = dist.get_process_group_ranks(group) if some and dist.is_initialized() else None
                w.rec.add("coll", name=name, at=where(), step=w.state["step"], group=ranks)
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
        with Quietly(w):
            w.rec.add("loader", **describe_loader(w, self, DistributedSampler))

    return dataloader_init


def describe_loader(w, loader, DistributedSampler):
    """A DataLoader the script made, read without calling anything of the script's: its samplers are
    read as stored, and a length is asked only of torch's own samplers (whose length torch asks itself
    as the loader goes), never of a sampler of the script's, which may have none (an infinite one)."""
    info = w.of.set(loader, {"id": len(w.loaders), "indices": None, "passes": 0, "pass": None})
    w.loaders.append(info)
    batch_sampler, sampler = attribute(loader, "batch_sampler"), attribute(loader, "sampler")
    chain, current = [], batch_sampler if batch_sampler is not None else sampler
    for _ in range(4):  # BatchSampler(DistributedSampler(...)), and the like
        if current is None:
            break
        chain.append(current)
        current = attribute(current, "sampler")
    distributed = next((s for s in chain if isinstance(s, DistributedSampler)), None)
    dataset, offset = attribute(loader, "dataset"), None
    while type(dataset).__name__ == "Subset" and is_torchs(dataset):  # a Subset: the indices
        indices = [int(i) for i in dataset.indices]
        offset = indices if offset is None else [offset[i] for i in indices]
        dataset = dataset.dataset
    info["indices"] = offset
    subset = fingerprint(offset) if offset is not None else None  # which of the dataset's samples
    mapped = attribute(loader, "_dataset_kind") == 0
    torchs = mapped and chain and all(is_torchs(s) for s in chain)
    return dict(
        id=info["id"],
        at=where(),
        dataset=type(dataset).__name__,
        # a length asked only of torch's own (a TensorDataset's, or one its own samplers ask anyway), else
        # read from the data the dataset holds, as stored
        length=length_of(dataset) if torchs or (mapped and is_torchs(dataset)) else stored_length(dataset),
        batches=length_of(loader) if torchs else None,
        data=dataset_fingerprint(dataset),
        **({"subset": subset} if subset is not None else {}),
        sampler=type(sampler).__name__,
        distributed=distributed is not None
        and {
            "rank": distributed.rank,
            "num_replicas": distributed.num_replicas,
            "shuffle": distributed.shuffle,
            "drop_last": distributed.drop_last,
        },
    )


def length_of(thing):
    try:
        return len(thing)
    except Exception:  # noqa: BLE001 (a length torch cannot give: none is recorded)
        return None


@watches("torch.utils.data.DataLoader", "__iter__", step=3, label="iter(DataLoader)")
def dataloader_iter(original, w, _):
    def dataloader_iter(self):
        info = w.of.get(self)
        if info is not None:
            with Quietly(w):
                # the pass begins before the iterator is made: with workers, torch hands them their first
                # indices (_next_index) while it makes the iterator, or resets a persistent one
                info["passes"] += 1
                info["pass"] = {"loader": info["id"], "batches": 0, "backward": 0}
                w.rec.add(
                    "pass", loader=info["id"], n=info["passes"], at=where(), grad=grad_enabled(),
                    eval=any(not m.training or not m.module.training for m in w.models()),
                )  # fmt: skip
        iterator = original(self)
        if info is not None:
            with Quietly(w):
                w.of.set(iterator, info["pass"])
        return iterator

    return dataloader_iter


@watches("torch.utils.data.dataloader._BaseDataLoaderIter", "_reset", step=3, label="iter(DataLoader)")
def dataloader_reset(original, w, _):
    def dataloader_reset(self, loader, *args, **kwargs):
        with Quietly(w):
            info = w.of.get(loader)
            if info is not None:
                w.of.set(self, info["pass"])  # the pass its loader began
        return original(self, loader, *args, **kwargs)

    return dataloader_reset


@watches("torch.utils.data.dataloader._BaseDataLoaderIter", "_next_index", step=3, label="next(DataLoader)")
def dataloader_next_index(original, w, _):
    def dataloader_next_index(self):
        index = original(self)
        with Quietly(w):
            current = w.of.get(self)
            if current is not None:
                indices = index if type(index) in (list, tuple) else [index]
                if all(type(i) is int for i in indices):  # a map-style dataset's indices
                    offset = w.loaders[current["loader"]]["indices"]
                    indices = [offset[i] for i in indices] if offset else list(indices)
                    w.rec.add("batch", loader=current["loader"], idx=indices, data=None)
        return index

    return dataloader_next_index


@watches("torch.utils.data.dataloader._BaseDataLoaderIter", "__next__", step=3, label="next(DataLoader)")
def dataloader_next(original, w, _):
    def dataloader_next(self):
        try:
            batch = original(self)
        except StopIteration:
            with Quietly(w):
                current = w.of.get(self)
                if current is not None:  # the pass is over: its batches, and the backward passes on them
                    w.rec.add(
                        "end",
                        loader=current["loader"],
                        batches=current["batches"],
                        backward=current["backward"],
                    )
            raise
        with Quietly(w):
            current = w.of.get(self)
            if current is not None:
                current["batches"] += 1
                w.state["pass"] = current
                if w.loaders[current["loader"]]["indices"] is None and self._dataset_kind == 1:  # iterable
                    w.rec.add("batch", loader=current["loader"], idx=None, data=fingerprint(batch))
        return batch

    return dataloader_next


@watches("torch.utils.data.DistributedSampler", "set_epoch", step=3, label="sampler.set_epoch()")
def sampler_set_epoch(original, w, _):
    def sampler_set_epoch(self, epoch):
        with Quietly(w):
            if called_by_user():
                w.rec.add("set_epoch", epoch=epoch, at=where())
        return original(self, epoch)

    return sampler_set_epoch


@watches("torch.distributed.algorithms.join.Join", "__init__", step=3, label="Join(...)")
def join_init(original, w, _):
    def join_init(self, *args, **kwargs):
        with Quietly(w):
            w.rec.add("join", at=where())
        return original(self, *args, **kwargs)

    return join_init


# DDP step 4: the wrapper, what goes through it, and the replicas' weights


def grad_enabled():
    import torch

    return torch.is_grad_enabled()


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
        first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
        if not torch.is_grad_enabled():
            evaluated(w, first)  # a forward without gradients: evaluation, or inference
            return
        w.state["forward"] += 1
        # DDP prepares the all-reduce of the coming backward here, at forward time, or not
        w.state["last"] = bool(ddp.require_backward_grad_sync)
        w.state["prepared"] += w.state["last"]
        if first is not None and first.numel():
            w.inputs.append(input_sum(first))


def input_sum(tensor):
    """A batch summed up, to compare between ranks and steps: up to 1,024 of its values, weighted
    by their place, kept on the batch's device until the process ends (no sync with a GPU)."""
    import torch

    flat = tensor.detach().reshape(-1)
    sample = flat[:: max(1, flat.numel() // 1024)][:1024].double()
    return (sample * torch.arange(1, len(sample) + 1, device=sample.device)).sum()


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


def without_hooks(state, handles):
    """A model's state (Module.__getstate__), without the forward pre-hooks of these handles."""
    if handles:
        ours = {handle.id for handle in handles}
        state = dict(state)
        for name in ("_forward_pre_hooks", "_forward_pre_hooks_with_kwargs"):
            if isinstance(state.get(name), dict):
                state[name] = type(state[name])((k, v) for k, v in state[name].items() if k not in ours)
    return state


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
    """Every optimizer step (torch's post-step hook): what happened since the last."""
    state = w.state
    with Quietly(w):
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


# FSDP: a model sharded, what goes through it, and the full state dict gathered


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


# DDP step 6: checkpoints saved and loaded, and every file written


@watches("torch", "save", step=6, label="torch.save()")
def torch_save(original, w, _):
    def torch_save(obj, f, *args, **kwargs):
        event = None
        with Quietly(w):
            if called_by_user():
                path = path_of(f)
                event = dict(path=path and os.path.abspath(path), at=where(), what=describe_checkpoint(obj))
        result = original(obj, f, *args, **kwargs)
        if event is not None:
            with Quietly(w):
                # what a resume would meet, exercised here, where it is cheap: the file read back as
                # torch.load(weights_only=True) reads it (its pickle alone, not its tensors)
                event["unsafe"], event["unsafe_at"] = refused_on_load(event["path"], obj)
                w.rec.add("save", **event)
        return result

    return torch_save


def refused_on_load(path, obj):
    """(the globals torch.load(weights_only=True) refuses in the file just saved at path, where in obj
    the first value of such a type is), or (None, None) where it cannot be read back (a buffer in
    memory, the legacy format). torch reads only the file's pickle, and calls nothing in it."""
    import torch

    try:
        unsafe = sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path)) if path else None
    except Exception:  # noqa: BLE001 (not a zip checkpoint: not known)
        return None, None
    return unsafe, (first_of_type(obj, unsafe) if unsafe else None)


def first_of_type(value, names, at="", depth=0):
    """Where in a saved object the first value is whose type is one of names (module.Name, as torch's
    refusal names them), or of numpy's where one of them is numpy's: "['args']: argparse.Namespace";
    None if none is. Read as stored: no method of the script's objects is called."""
    import torch

    kind = type(value)
    name = f"{kind.__module__}.{kind.__qualname__}"
    if name in names or (kind.__module__ == "numpy" and any(n.startswith("numpy") for n in names)):
        return f"{at or 'the object'}: {name}"
    if depth > 4 or isinstance(value, torch.Tensor):
        return None
    if isinstance(value, dict):
        items = list(dict.items(value))[:256]  # dict's own: no items() of a subclass of the script's
    elif type(value) in (list, tuple):
        items = list(enumerate(value))[:256]
    else:
        return None
    for key, item in items:
        found = first_of_type(item, names, f"{at}[{key!r}]", depth + 1)
        if found:
            return found
    return None


@watches("torch", "load", step=6, label="torch.load()")
def torch_load(original, w, _):
    def torch_load(f, *args, **kwargs):
        with Quietly(w):
            if called_by_user():
                path = path_of(f)
                w.rec.add(
                    "load",
                    path=path and os.path.abspath(path),
                    at=where(),
                    weights_only=kwargs.get("weights_only"),
                    map_location="map_location" in kwargs or len(args) > 0,
                    shared=path is not None and shared_folder(path),
                )
        return original(f, *args, **kwargs)

    return torch_load


def shared_folder(path):
    """Whether the folder of path is one any user of the machine may write to (/tmp, /dev/shm): a file
    there could have been put or replaced by another process than the job's."""
    import stat

    try:
        return bool(os.stat(os.path.dirname(os.path.abspath(path))).st_mode & stat.S_IWOTH)
    except OSError:
        return None


@watches("torch.nn.Module", "load_state_dict", step=6, label="model.load_state_dict()")
def load_state_dict(original, w, _):
    from torch.nn.parallel import DistributedDataParallel

    def load_state_dict(self, state_dict, *args, **kwargs):
        with Quietly(w):
            if called_by_user():
                keys = list(state_dict) if isinstance(state_dict, dict) else []
                w.rec.add(
                    "load_state",
                    into=type(self).__name__,
                    ddp=isinstance(self, DistributedDataParallel),
                    prefixed=bool(keys) and all(str(k).startswith("module.") for k in keys),
                    at=where(),
                )
        return original(self, state_dict, *args, **kwargs)

    return load_state_dict


def audit(w, event, args):
    """Python's audit hook: every file the script opens to write, or renames into place; an MPI
    library imported, which other launchers (mpirun) tell who each process is. (An error in an audit
    hook stops what it audits: none of this file's may reach the script's open().)"""
    if event in ("open", "os.rename", "os.replace", "os.mkdir", "import"):
        with Quietly(w):
            audited(w, event, args)


def audited(w, event, args):
    if event == "import" and args[0] == "mpi4py" and w.rec.enabled and "import mpi4py" not in w.read:
        w.read.add("import mpi4py")
        frame = outside_stdlib()
        by = "script" if frame is not None and is_users(frame.f_code.co_filename) else "library"
        found = importlib.util.find_spec("mpi4py") is not None
        w.rec.add("read", key="import mpi4py", by=by, at=where(), found=found)
    if not w.rec.enabled or event not in ("open", "os.rename", "os.replace", "os.mkdir"):
        return
    if event == "os.mkdir":  # a folder made: a name that a second maker finds taken
        if not isinstance(args[0], (str, bytes)):
            return
        target, how_written = os.path.realpath(os.fsdecode(args[0])), "create"
    elif event == "open":
        path, mode, flags = args
        if not isinstance(path, (str, bytes)) or not (
            (isinstance(mode, str) and set(mode) & set("wax+")) or (mode is None and flags & 0o3)
        ):
            return
        target = os.path.realpath(os.fsdecode(path))
        appends = "a" in mode if isinstance(mode, str) else bool(flags & os.O_APPEND)
        kept = "+" in mode and "w" not in mode if isinstance(mode, str) else not flags & os.O_TRUNC
        how_written = "append" if appends else None if kept else "overwrite"
    else:
        target = os.path.realpath(os.fsdecode(args[1]))
        how_written = "overwrite"
    if target.startswith((w.folder, "/dev/", "/proc/", "/sys/", w.caches, *LIBRARY_DIRS)) or re.search(
        r"torchinductor|triton|__pycache__", target
    ):
        return  # not the script's files: this tool's, the system's, torch's caches
    at = where()
    if (target, at, event) not in w.written:
        w.written.add((target, at, event))
        source = os.path.realpath(os.fsdecode(args[0])) if event in ("os.rename", "os.replace") else None
        w.rec.add("write", path=target, at=at, how=event, source=source, mode=how_written)


# DDP step 8: a script that starts its own processes


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


def dist_initialized():
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


# a crash: the script's own error, where it was raised, and in which watched call; the end


def excepthook(w, previous_hook, kind, error, tb):
    with Quietly(w):
        record_crash(w, kind, error, tb)
    previous_hook(kind, error, tb)


def record_crash(w, kind, error, tb):
    import traceback

    frames = traceback.extract_tb(tb)
    users = [f for f in frames if is_users(f.filename)]
    call, walk, within = None, tb, False
    while walk is not None:  # the innermost watched call, and whether the script's code ran inside it
        if walk.tb_frame.f_code in CALL_OF_CODE:
            call, within = CALL_OF_CODE[walk.tb_frame.f_code], False
        elif call is not None and is_users(walk.tb_frame.f_code.co_filename):
            within = True
        walk = walk.tb_next
    w.rec.add(
        "crash",
        type=kind.__name__,
        message=ends(str(error).strip()),
        at=f"{os.path.relpath(users[-1].filename)}:{users[-1].lineno}" if users else None,
        by_script=bool(frames) and is_users(frames[-1].filename),
        call=call,
        loader=w.state["pass"] and w.state["pass"]["loader"],
        raised=who_raised(tb, error),
        path=os.path.realpath(os.fsdecode(error.filename))
        if isinstance(error, OSError) and isinstance(error.filename, (str, bytes))
        else None,
        program=missing_program(frames, error),
        within=within,
    )


def missing_program(frames, error):
    """The program the script ran that this machine lacks: a FileNotFoundError raised as subprocess
    started it (nvidia-smi on a machine without GPUs, git where none is installed), or None."""
    started = any(f.name == "_execute_child" and f.filename.endswith("subprocess.py") for f in frames)
    if isinstance(error, FileNotFoundError) and started:
        return os.path.basename(os.fsdecode(error.filename)) if error.filename else "a program"
    return None


def who_raised(tb, error):
    """Whose code raised an error: "raise", a raise or assert statement of the script's; "checker",
    this file's own code (not a call it passes on, nor a GPU error it acts out for the stand-in);
    "call", a call the script made (into torch, a library, or its own C code)."""
    import dis

    while tb.tb_next is not None:
        tb = tb.tb_next
    code, line = tb.tb_frame.f_code, tb.tb_lineno
    if os.path.realpath(code.co_filename) == THIS_FILE:
        return "call" if any(a <= line <= b for a, b in passed_on()) else "checker"
    if is_users(code.co_filename):
        instruction = next((i for i in dis.get_instructions(code) if i.offset == tb.tb_lasti), None)
        if instruction is not None and instruction.opname in ("RAISE_VARARGS", "RERAISE"):
            return "raise"
    return "call"


@functools.lru_cache(maxsize=1)
def passed_on():
    """The lines of this file where a wrapper calls what it wraps (original(...), real(...)): an error
    raised there is the call's, passed on, not this file's."""
    tree = ast.parse(Path(THIS_FILE).read_text())
    return [
        (node.lineno, node.end_lineno)
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("original", "real")
    ]


def ends(message):
    """A long error message's beginning and end: a child's traceback ends with its own error."""
    return message if len(message) <= 1200 else f"{message[:400]}\n...\n{message[-800:]}"


def at_exit(w):
    with Quietly(w):
        write_exit(w)


def write_exit(w):
    import torch

    values = {}
    if w.weights:
        with torch.no_grad():
            flat = [local(p).double().reshape(-1) for p in w.weights]
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
        eval_inputs=[float(x) for x in torch.stack(w.eval_inputs).tolist()] if w.eval_inputs else [],
        empty=sorted({path for path, _, how in w.written if how != "os.mkdir" and is_empty(path)}),
        files=own_files(w),
        # the last sharded model's parameters as held (kept alive by w.weights, the model freed or not)
        sharded=sum(float(local(p).double().sum()) for p in w.weights) if w.sharded else None,
    )


def local(tensor):
    """A tensor's values on this rank, detached: a DTensor's local shard (its to_local(), a view, no
    collective), else the tensor itself. The watcher never gathers a sharded model's parameters."""
    to_local = getattr(type(tensor), "to_local", None)
    return (to_local(tensor) if to_local is not None else tensor).detach()


def local_sum(module):
    """The sum of a model's parameters as this rank holds them (its local shards, for a sharded model)."""
    import torch

    with torch.no_grad():
        return sum(float(local(p).double().sum()) for p in module.parameters())


def is_empty(path):
    try:
        return os.path.isfile(path) and os.path.getsize(path) == 0
    except OSError:
        return False


def own_files(w):
    """The script's own Python files that this process imported (the script's, and its modules beside
    it), as the records cite files: so that the judge can read the code the run did not reach."""
    found = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(".py") and is_users(path) and os.path.isfile(path):
            real = os.path.realpath(path)
            if not real.startswith(w.folder):  # this check's own sitecustomize
                found.add(os.path.relpath(real))
    return sorted(found)


# Launch variables read, and a local rank taken from the command line


READ_KEYS = ("LOCAL_RANK", "RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK")
# who a process is, as other launchers say it: Open MPI's mpirun, MPICH/Intel MPI's (PMI), SLURM's srun
OTHER_LAUNCHERS = re.compile(
    r"OMPI_COMM_WORLD_(LOCAL_)?(RANK|SIZE)|PMI_(RANK|SIZE)|MV2_COMM_WORLD_RANK|SLURM_(PROCID|LOCALID|NTASKS)"
)


@watches("os._Environ", "__getitem__", step=8, label="os.environ[...]")
def environ_getitem(original, w, _):
    def environ_getitem(self, key):
        with Quietly(w):
            if (
                self is os.environ
                and key not in w.read
                and (key in READ_KEYS or OTHER_LAUNCHERS.fullmatch(str(key)))
            ):
                w.read.add(key)
                frame = outside_stdlib()
                by = "script" if frame is not None and is_users(frame.f_code.co_filename) else "library"
                w.rec.add("read", key=key, by=by, at=where(), found=key in os.environ)
        return original(self, key)

    return environ_getitem


@watches("argparse.ArgumentParser", "parse_known_args", step=8, label="parser.parse_args()")
def parse_known_args(original, w, _):
    def parse_known_args(self, args=None, namespace=None):
        parsed = original(self, args, namespace)
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


# -----------------------------------------------------------------------------
# 2b. the stand-in: CUDA and NCCL on the CPU, so that a GPU script runs unchanged on a laptop
#
# Where the job has fewer GPUs than processes (or --cpu), each process is shown the GPUs of its
# node (as many as its node's processes) and runs on the CPU: a GPU the script asks for becomes the
# CPU (and is recorded, with the line), nccl becomes gloo, torch.cuda answers as a GPU would as far
# as training goes. A tensor the script puts "on a GPU" keeps its GPU beside it: so the judge knows
# where the model and the batches would be. These are wrappers of the calls that name a device, not
# a TorchFunctionMode (as torch.utils._device.DeviceContext is): a mode sees every torch call, and a
# pass-through one measured +56% a step on a small model here; the calls that name a device cost
# the same with or without the stand-in.
#
# The stand-in is one object, StandIn, with a state of its own, and what it puts in torch's place is
# declared as the watcher's wrappers are (stands_in, replaces: WRAPPERS, looked up by missing_names).
# It says what it stood in for in records of its own ("gpu", "input", "ddp_gpus", device_count
# read); the watcher never reads its state, and the judge reads both from the records.


def stands_in(owner, *names, step, label, compiled_through=False):
    """Declare a wrapper of the stand-in's: make(original, stand_in, name), applied before the watcher's."""
    return watches(owner, *names, step=step, label=label, compiled_through=compiled_through, standin=True)


def replaces(owner, *names):
    """Declare what the stand-in puts in place of owner.name, for each name: make(original, stand_in,
    name) returns it, as it is (a class, a constant answer: not a call the records name)."""

    def register(make):
        for name in names:
            WRAPPERS.append(Wrapper(owner, name, f"{owner}.{name}", make, False, True, as_is=True))
        return make

    return register


class StandIn:
    """A GPU node, for one process of the job, on the CPU: how many GPUs its node has, which one is
    current, where each tensor the script put "on a GPU" is, and the hook it keeps on each model the
    script put on one, until that model's first batch."""

    def __init__(self, rec, node_gpus):
        import torch

        self.rec, self.node_gpus = rec, node_gpus
        self.gpu = 0  # the current GPU (torch.cuda.set_device)
        self.asked = set()  # (how, GPU, line) already recorded
        self.counted = False  # torch.cuda.device_count() read by the script: recorded once
        self.tags = Beside()  # the GPU of each tensor the script put "on a GPU", kept beside it
        self.hooks = Beside()  # each model put on a GPU: the hook waiting for its first batch, then None
        self.fed = Beside()  # each DDP model whose first training batch is recorded
        self.faults = set()  # where its own bookkeeping failed (Quietly)
        self.rng_state = torch.zeros(16, dtype=torch.uint8)  # a GPU's random generator's state
        self.autocast, self.scaler = autocast_on_cpu(torch), grad_scaler_on_cpu(torch)
        # torch.compile traces none of its bookkeeping on a DDP forward
        self.note_input = torch.compiler.disable(self.note_input)

    def placed(self, tensor):
        """Where a tensor is, for the script: the GPU it asked for, else its device."""
        index = self.tags.get(tensor)
        return f"cuda:{index}" if index is not None else str(tensor.device)

    def on_gpu(self, tensor, index):
        self.tags.set(tensor, index)
        return tensor

    def index(self, device):
        """The GPU a device names (an int, "cuda", "cuda:1", torch.device), or None if not a GPU."""
        import torch

        if isinstance(device, int) and not isinstance(device, bool):
            return device
        if isinstance(device, str):
            if not device.startswith("cuda"):
                return None
            try:
                device = torch.device(device)
            except RuntimeError:  # torch refuses it ("cuda:-1") on GPUs too: the script's call's error
                self.record(None, "device", refused="invalid")
                raise
        if isinstance(device, torch.device) and device.type == "cuda":
            return self.gpu if device.index is None else device.index
        return None

    def record(self, index, how, refused=None):
        """A GPU asked for, and whether it was refused, recorded once a way and line."""
        at = where()
        if (how, index, at) not in self.asked:
            self.asked.add((how, index, at))
            self.rec.add("gpu", how=how, index=index, at=at, **({"refused": refused} if refused else {}))

    def ask(self, index, how):
        """The script asks for a GPU: recorded (once a way and line); one its node lacks fails, as
        CUDA's own "invalid device ordinal" does, and a negative index as torch's own check does."""
        gpus = self.node_gpus
        self.record(index, how, refused="negative" if index < 0 else "past_node" if index >= gpus else None)
        if index < 0:
            raise RuntimeError(f"Device index must not be negative (check_ddp: cuda:{index} asked)")
        if index >= gpus:
            raise RuntimeError(
                f"CUDA error: invalid device ordinal (check_ddp: cuda:{index} asked, and this node has "
                f"{gpus} GPU{'s' if gpus > 1 else ''}, cuda:0 to cuda:{gpus - 1})"
            )
        return index

    def wait_for_first_batch(self, model):
        """A model put on a GPU: where its first batch comes from is recorded (once a model)."""
        with Quietly(self):
            if self.hooks.get(model, False) is False:
                self.hooks.set(model, model.register_forward_pre_hook(self.first_input))

    def first_input(self, module, args):
        """A model on a GPU gets its first batch: where that batch is (on a GPU, both must be on one)."""
        import torch

        with Quietly(self):
            self.drop_hook(module)
            first = next((a for a in args if isinstance(a, torch.Tensor)), None)
            if first is not None:
                model = self.placed(next(module.parameters(), first))
                self.rec.add("input", device=self.placed(first), model=model, at=where())

    def drop_hook(self, module):
        """Take the hook off a model that is compiled, or wrapped: a hook of a file outside torch makes
        torch.compile trace a model it would otherwise leave alone (2 graphs where there are 0, for
        torch.compile(DDP(nn.Sequential))), and the check must not change what it sees."""
        handle = self.hooks.get(module)
        if handle:
            handle.remove()
            self.hooks.set(module, None)

    def note_input(self, ddp, args, kwargs):
        """A DDP model's first training forward: where its batch is, and where the model is."""
        import torch

        with Quietly(self):
            if torch.is_grad_enabled() and not self.fed.get(ddp):
                self.fed.set(ddp, True)
                first = next((a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)), None)
                if first is not None:
                    model = self.placed(next(ddp.module.parameters(), first))
                    self.rec.add("input", device=self.placed(first), model=model, at=where())

    # torch.cuda's functions, as the node's GPUs would answer (CUDA_ANSWERS)

    def set_device(self, device):
        index = self.index(device)
        if index is not None and index >= 0:  # set_device(-1), or a cpu device: nothing, as in torch
            self.gpu = self.ask(index, "set_device")

    @contextlib.contextmanager
    def current(self, device):
        before = self.gpu
        self.set_device(device)
        yield
        self.gpu = before

    def device_count(self):
        """The node's GPUs. Read, like LOCAL_RANK: a GPU index may come from it."""
        if not self.counted:
            self.counted = True
            self.rec.add("read", key="device_count", by="script", at=where(), found=True)
        return self.node_gpus


class StandInProperties(types.SimpleNamespace):
    """torch.cuda.get_device_properties(): what a stand-in GPU says of itself. A property it lacks
    fails naming this class: the stand-in's gap, reported as not checked, never as the script's."""


PROPERTIES = StandInProperties(
    name="check_ddp stand-in GPU (the CPU)", total_memory=80 * 2**30, major=9, minor=0,
    multi_processor_count=132, is_integrated=False,
)  # fmt: skip


class StandInEvent:
    """torch.cuda.Event(enable_timing=True): record() marks the time, elapsed_time() measures."""

    def __init__(self, enable_timing=False, blocking=False, interprocess=False, external=False):
        self.time = None

    def record(self, stream=None):
        self.time = time.perf_counter()

    def elapsed_time(self, end):
        return (end.time - self.time) * 1000.0

    def synchronize(self):
        pass

    def query(self):
        return True

    def wait(self, stream=None):
        pass


class StandInStream:
    """A CUDA stream: work on the CPU is in order already."""

    def __init__(self, device=None, priority=0, **kwargs):
        self.device = device

    def synchronize(self):
        pass

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        event = event or StandInEvent()
        event.record()
        return event

    def query(self):
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def nothing(s, *args, **kwargs):
    return None


def zero(s, *args, **kwargs):
    return 0


# torch.cuda's functions as the node's GPUs answer them: each called with the stand-in first
CUDA_ANSWERS = {
    "is_available": lambda s: True,
    "is_initialized": lambda s: True,
    "device_count": StandIn.device_count,
    "current_device": lambda s: s.gpu,
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
    "get_rng_state_all": lambda s, *args, **kwargs: [s.rng_state.clone()] * s.node_gpus,
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


@functools.lru_cache(maxsize=4096)
def in_torch(code):
    return bool(TORCH_DIR) and os.path.realpath(code.co_filename).startswith(TORCH_DIR)


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


def autocast_on_cpu(torch):
    """torch.autocast("cuda", ...) in bfloat16 on the CPU, the CPU's half precision."""

    class autocast(torch.amp.autocast_mode.autocast):
        def __init__(self, device_type="cuda", dtype=None, enabled=True, cache_enabled=None):
            if device_type == "cuda":
                device_type, dtype = "cpu", torch.bfloat16
            super().__init__(device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    return autocast


def grad_scaler_on_cpu(torch):
    """torch.amp.GradScaler("cuda"), torch.cuda.amp.GradScaler(): a scaler that scales, on the CPU."""

    class GradScaler(torch.amp.GradScaler):
        def __init__(self, device="cuda", *args, **kwargs):
            super().__init__("cpu" if device == "cuda" else device, *args, **kwargs)

    return GradScaler


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


@replaces("torch.distributed", "is_nccl_available")
def nccl_available(original, s, _):
    return lambda: True  # nccl, asked for, becomes gloo (init_on_gloo)


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


# The calls that name a device: the GPU asked for is recorded, and the CPU used


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


# What the stand-in keeps on the script's models, out of what the script makes of them: its copies
# and pickles, and torch.compile's graphs


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


# NCCL: gloo, between the CPUs; the GPUs each DDP call names, asked for


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
        # a mesh of the node's GPUs: of its CPUs, over gloo, as the group is
        return original("cpu" if str(device_type).startswith("cuda") else device_type, *args, **kwargs)

    return device_mesh_on_cpu


@stands_in("torch.distributed.fsdp", "fully_shard", step=4, label="fully_shard()")
@stands_in("torch.distributed.fsdp._fully_shard._fully_shard", "fully_shard", step=4, label="fully_shard()")
def fully_shard_on_cpu(original, s, _):
    def fully_shard_on_cpu(module, *args, **kwargs):
        # where the script put the parameters this call shards (those a call before sharded are new)
        devices = sorted({s.placed(p) for p in module.parameters() if type(p).__name__ != "DTensor"})
        result = original(module, *args, **kwargs)
        with Quietly(s):
            s.drop_hook(module)  # its first batch: the sharded forward's
            if devices:
                s.rec.add("ddp_gpus", at=where(), devices=devices)
        return result

    return fully_shard_on_cpu


@stands_in("torch.distributed.fsdp.FullyShardedDataParallel", "__init__", step=4, label="FSDP(...)")
def fsdp1_on_cpu(original, s, _):
    signature = inspect.signature(original)

    def fsdp1_on_cpu(self, *args, **kwargs):
        given = signature.bind_partial(self, *args, **kwargs).arguments
        devices = sorted({s.placed(p) for p in given["module"].parameters()})
        device_id = given.pop("device_id", None)
        if device_id is not None and s.index(device_id) is not None:
            devices = [f"cuda:{s.ask(s.index(device_id), 'device_id')}"]  # FSDP moves the model there
        original(**given)
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
    follows: dict = None  # {step: text}: the steps whose lines follow from this finding


@dataclass
class Found:
    """What a rule returns when it finds its mistake: the message, built from the evidence, and,
    where the evidence changes them, its help and what of the job's end it explains."""

    message: str
    help: str = None
    explains: tuple = None
    follows: dict = None  # {step: what of that step follows from this finding}: those steps say so
    step: int = None  # the step of the line, for a rule of no step of its own (AT_THE_END)
    see: str = None  # a pitfall for this finding, where the rule's is not the one that shows it
    verdict: str = None  # "--": the rule saw it, and it is not the script's mistake (not checked)


@dataclass
class Rule:
    code: str  # DDP<step><nn>: DDP306 is step 3's; DDP1003, step 10's; DDP000, a crash at any step
    step: int
    verdict: str  # FAIL or warn
    check: object  # check(facts) -> Found, or None
    help: str
    see: str  # a key of PITFALLS, or None
    explains: tuple  # "crash", "hang": what of the job's end the finding accounts for, by default
    sets_aside: str  # a mistake that stops the job, which a run again can set aside: a key of SET_ASIDE
    # "root": a launch of the script's own (its processes, or who they are, not torchrun's: DDP step 8);
    # "follows": a finding that follows from such a launch, where one FAILs or was set aside (its ranks
    # never formed torchrun's job: they meet elsewhere, claim one rank, or train alone)
    launch: str

    @property
    def doc(self):
        return inspect.cleandoc(self.check.__doc__ or "")


RULES = {}  # code: Rule
# The order each step's rules are tried in: the first that finds something is the step's line. Ranks
# that fell out of step come first (a hang or a lost peer explains what else looks wrong); then a
# cause before its symptoms, and a FAIL before a warn of the same evidence.
ORDER = {
    1: ("DDP101", "DDP102", "DDP103", "DDP104", "DDP105", "DDP106", "DDP107"),
    2: ("DDP201", "DDP202", "DDP203", "DDP204", "DDP205"),
    3: ("DDP307", "DDP301", "DDP302", "DDP303", "DDP304", "DDP305", "DDP306"),
    4: ("DDP401", "DDP403", "DDP404", "DDP405", "DDP408", "DDP406", "DDP407"),
    5: ("DDP508", "DDP506", "DDP505"),
    6: (
        "DDP609",
        "DDP614",
        "DDP611",
        "DDP601",
        "DDP602",
        "DDP612",
        "DDP610",
        "DDP603",
        "DDP608",
        "DDP604",
        "DDP605",
        "DDP606",
        "DDP607",
        "DDP613",
    ),  # fmt: skip
    7: ("DDP701", "DDP702"),
    8: ("DDP801", "DDP805", "DDP807", "DDP808", "DDP806", "DDP804"),
    9: ("DDP901", "DDP902"),
    10: ("DDP1007", "DDP1001", "DDP1002", "DDP1008", "DDP1005", "DDP1006", "DDP1003", "DDP1004"),
}
# What no step's line accounts for, tried once every step has its line, in this order: a crash (its
# line at the step the rank was in), then a job the check had to stop (never a pass).
AT_THE_END = ("DDP000", "DDP504")
# Codes that existed and were retired: what a report that named one means now. A code is never
# reused; --explain OLD says where it went.
RETIRED = {
    "DDP402": "retired: SyncBatchNorm on a CPU. The stand-in runs SyncBatchNorm as BatchNorm on the CPU, "
    "so a GPU script is checked as it runs on GPUs; a CPU script of yours that uses it fails with its own "
    "error (DDP000).",
    "DDP501": "moved to DDP609 (DDP step 6): a collective inside a rank-only block, under the step the "
    "README teaches it in.",
    "DDP502": "moved to DDP307 (DDP step 3): uneven inputs, ranks with different numbers of batches.",
    "DDP503": "moved to DDP1007 (DDP step 10): ranks that leave the training loop apart (an early stop).",
    "DDP802": "retired: nccl asked for on a machine without GPUs. nccl is stood in by gloo there: the "
    "script is checked as it runs on GPUs.",
    "DDP803": "retired: a GPU asked for on a machine without GPUs. CUDA is stood in on the CPU there; what "
    "cannot be stood in is not checked (--), never the script's mistake.",
}
SUMMARIES = {}  # step: the function saying ok or -- (not checked) when no rule finds anything


# What a run again sets aside, as the report says it
SET_ASIDE = {
    "launch": "with the script's own launch variables and init_process_group() arguments set aside "
    "(torchrun's kept)",
    "layout": "as one node of all the processes",
}


def rule(code, verdict, help, see=None, explains=(), sets_aside=None, launch=None):
    """Declare a rule: the function under it looks at the facts and returns Found, or None."""

    def register(check):
        assert code not in RULES, f"{code} is taken"
        RULES[code] = Rule(
            code, int(code[3:-2]), verdict, check, help, see, tuple(explains), sets_aside, launch
        )
        return check

    return register


def summary(step):
    """Declare what a step says when none of its rules finds anything: (verdict, message), or None
    for no line."""

    def register(function):
        SUMMARIES[step] = function
        return function

    return register


def runs(job):
    """The job, and each run of it again with what stopped it set aside, in order."""
    found = [job]
    while found[-1].then:
        found.append(Job.load(found[-1].folder / found[-1].then))
    return found


def stopper(line):
    """A FAIL that stopped its run and that a run again set aside (RULES' sets_aside)."""
    return line.verdict == "FAIL" and line.code in RULES and RULES[line.code].sets_aside is not None


def judge(job):
    """The job's lines; for a job run again with what stopped it set aside, each such finding from the
    run that found it, and every other step from the last run."""
    chain = runs(job)
    judged = [judge_one(run) for run in chain]
    job.judge_errors += [e for run in chain[1:] for e in run.judge_errors]
    job.ignored += [x for run in chain[1:] for x in run.ignored if x not in job.ignored]
    job.unknown_ignores += [
        x for run in chain[1:] for x in run.unknown_ignores if x not in job.unknown_ignores
    ]
    kept = {}
    for lines in judged[:-1]:
        for line in lines:
            if stopper(line) and line.step not in kept:
                kept[line.step] = line
    last = [x for x in judged[-1] if x.step not in kept]
    launch = [x.step for x in kept.values() if RULES[x.code].sets_aside == "launch"]
    if launch and "launch" in chain[-1].aside:  # the script numbers its processes itself: so do its samplers
        last = [
            Line(x.step, "--", f"follows from DDP step {min(launch)}: {x.message}")
            if RULES.get(x.code) and RULES[x.code].launch == "follows"
            else x
            for x in last
        ]
    # one cause, one FAIL, over the lines of every run: a stopper kept from the first run may follow
    # from a launch of the script's own that the run again still shows
    return consequences(sorted([*kept.values(), *last], key=in_order))


def judge_one(job):
    """A line per step: the first of its rules that finds something, else its summary; then a
    crash that no line explains, at the step it happened in."""
    facts = Facts(job)
    for step in STEPS:
        line = judge_step(facts, step)
        if line is not None:
            facts.lines.append(line)
            facts.explained |= line.explains
    for code in AT_THE_END:  # each puts its line at the step it names, in place of that step's
        found = tried(facts, code)
        if found is not None and not silenced(facts, code, found, found.step):
            line = finding(RULES[code], found, step=found.step)
            facts.lines = [old for old in facts.lines if old.step != line.step] + [line]
    return sorted(facts.lines, key=in_order)  # as found: judge() says what follows from what


def judge_step(facts, step):
    for code in ORDER[step]:
        found = tried(facts, code)
        if found is not None and not silenced(facts, code, found, step):
            return finding(RULES[code], found)
    said = SUMMARIES[step](facts)
    return Line(step, *said) if said else None


def silenced(facts, code, found, step):
    """Whether the script silences this finding: `# check_ddp: ignore[CODE]` on a line it names (a
    learner's warning accepted on purpose, as linters' noqa). Counted, and said in the report."""
    if found.verdict == "--":
        return False
    named = re.findall(r"[\w./-]+\.py:\d+", found.message)
    at = next((a for a in named if code in facts.source.ignores().get(a, ())), None)
    entry = (code, at, found.step if found.step is not None else step)
    if at is not None and entry not in facts.job.ignored:
        facts.job.ignored.append(entry)
    return at is not None


def tried(facts, code):
    """A rule's finding; a rule that fails is check_ddp's own error, said as such (never the script's),
    and finds nothing."""
    try:
        return RULES[code].check(facts)
    except Exception as error:  # noqa: BLE001
        facts.job.judge_errors.append(f"{code}: {type(error).__name__}: {error}")
        return None


def finding(rule, found, step=None):
    explains = rule.explains if found.explains is None else found.explains
    if found.verdict == "--":  # the rule declines to judge: what it saw is not the script's to answer for
        return Line(step or rule.step, "--", found.message, explains=frozenset(explains))
    return Line(
        step or rule.step, rule.verdict, found.message, rule.code, found.help or rule.help,
        found.see or rule.see, frozenset(explains), found.follows,
    )  # fmt: skip


def in_order(line):
    """The steps in order, the script's own error (step 0, no DDP step's) after them."""
    return (line.step == SCRIPT, line.step)


def consequences(lines):
    """One cause, one FAIL: a finding that says which later or earlier steps follow from it turns
    those steps' lines (unless ok) into `--`, saying so: the step whose change fixes it is the one
    that FAILs. A launch of the script's own (RULES' launch "root") is the cause of every finding that
    follows from one (launch "follows"): its ranks never formed the job torchrun made."""
    roots = {step: (line, text) for line in lines for step, text in (line.follows or {}).items()}
    launch = next(
        (x for x in lines if x.verdict == "FAIL" and rule_of(x) and rule_of(x).launch == "root"), None
    )
    if launch:  # the launch is the cause of what follows from it, and of what those findings say follows
        followers = {
            x.step
            for x in lines
            if x.verdict in ("FAIL", "warn") and rule_of(x) and rule_of(x).launch == "follows"
        }
        roots = {
            step: (line, text)
            for line in lines
            if line.step not in followers
            for step, text in (line.follows or {}).items()
        }
        roots |= {step: (launch, (launch.follows or {}).get(step, "")) for step in followers}
    out = []
    for line in lines:
        root = roots.get(line.step)
        # a line that is ok stays ok, unless the finding says what of it follows (its text)
        if root and (line.verdict != "ok" or root[1]) and root[0] is not line:
            text = root[1] or line.message
            line = Line(
                line.step, "--", f"follows from DDP step {root[0].step}: {text}", explains=line.explains
            )
        out.append(line)
    return out


def rule_of(line):
    return RULES.get(line.code) if line.code else None


def explain(code):
    """--explain: every code with its one-line summary; --explain CODE: that rule's page."""
    if not code:
        rules = sorted(RULES.values(), key=lambda r: (r.step or 99, int(r.code[3:])))  # by step, then code
        rows = [f"{r.code:<8} step {r.step or '-':<3} {r.verdict:<5} {r.doc.splitlines()[0]}" for r in rules]
        return "\n".join([f"The findings of check_ddp.py ({explain_command('CODE')} explains one):", *rows])
    rule = RULES.get(code.upper())
    if rule is None:
        return f"{code.upper()}: {RETIRED[code.upper()]}" if code.upper() in RETIRED else None
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
        self.lines = []  # the steps' lines so far
        self.source = Source(job)  # the script's code, for what the records do not show
        self.code = self.source.code  # a line as evidence: file:line `its text`

    @functools.cached_property
    def starts(self):
        return {r: e for r, e in self.job.records("start")}

    def local_rank(self, rank):
        return self.starts[rank]["local_rank"]

    @functools.cached_property
    def standin(self):
        """Whether CUDA and NCCL were stood in on the CPU."""
        return any(e.get("standin") for e in self.starts.values())

    @functools.cached_property
    def asked_nccl(self):
        return any("nccl" in e["backend"].lower() for _, e in self.job.records("init"))

    @functools.cached_property
    def on_gpus(self):
        """Whether the script runs on GPUs: on real ones, or asked for under the stand-in."""
        if self.job.device == "cuda":
            return True
        return bool(self.job.records("gpu")) or self.asked_nccl

    @functools.cached_property
    def model_devices(self):
        """Each rank's DDP model's devices, as the script placed them (stood in: the GPUs it asked for,
        which the stand-in's record says)."""
        stood_in = {r: e["devices"] for r, e in self.job.records("ddp_gpus")}
        wrapped = [*self.job.records("ddp"), *self.job.records("shard")]
        return {r: stood_in.get(r, e["devices"]) for r, e in wrapped}

    def read(self, key):
        """Whether any rank read the launch variable key (the script, or a library for it)."""
        return any(e["key"] == key and e["found"] for _, e in self.job.records("read"))

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

    @functools.cached_property
    def empty_files(self):
        """The files written that were empty at the end (a lock, a marker): nothing in them to tear. Each
        rank says which of its files were, as it ended."""
        return {path for _, e in self.job.records("exit") for path in e["empty"] or ()}

    @functools.cached_property
    def refused(self):
        """Each rank's first GPU the stand-in refused, as CUDA or torch would: its gpu record."""
        found = {}
        for r, e in self.job.records("gpu"):
            if e["refused"]:
                found.setdefault(r, e)
        return found

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
                    new = {"made": {}, "passes": {}, "data": {}, "training": False, "evaluating": False}
                    loaders.setdefault(e["id"], new)
                    loaders[e["id"]]["made"][rank] = e
                elif e["e"] == "pass" and e["loader"] in loaders:
                    loaders[e["loader"]]["evaluating"] |= not e["grad"] or e["eval"]
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
                elif e["e"] == "end" and e["loader"] in loaders and e["backward"]:
                    loaders[e["loader"]]["training"] = True  # trained on, by an optimizer of the script's own
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
    def init_failed(self):
        """What of the job's end init_process_group() accounts for: its crash, ranks waiting in it."""
        crashed = self.crash is not None and self.crash[1].get("call") == INIT
        return ("crash",) * crashed + ("hang",) * self.never_met

    @functools.cached_property
    def never_met(self):
        """The job hung with ranks still in init_process_group(): they never all met."""
        waiting = self.waiting_in(INIT)
        return bool(self.job.hung and waiting and len(self.job.records("met")) < len(self.job.ranks))

    @functools.cached_property
    def unmatched_collective(self):
        """The first collective the ranks did not call alike, each rank's collectives on the whole
        job's group compared in order: (its place in the sequences, {rank: its call there, or None});
        None where they match, or where a rank stopped on its own error (its sequence ends there)."""
        if self.job.records("spawn") or len(self.job.ranks) < 2:
            return None
        if any(not COMMUNICATION_ERROR.search(e["message"]) for _, e in self.job.records("crash")):
            return None
        sequences = {
            r: [
                e
                for e in events
                if e["e"] == "coll" and (e["group"] is None or len(e["group"]) == self.world)
            ]
            for r, events in self.job.ranks.items()
        }
        for i in range(max(map(len, sequences.values()), default=0)):
            calls = {r: s[i] if i < len(s) else None for r, s in sequences.items()}
            if len({(c["name"], c["at"]) if c else None for c in calls.values()}) > 1:
                return i, calls
        return None

    @functools.cached_property
    def weights_differ(self):
        """How the replicas' weights differ at the end ("" when they are equal; None when fewer
        than two ranks had any, or the model is sharded: each rank holds other parameters, by design)."""
        weights = {r: e["weights"] for r, e in self.job.records("exit") if e["weights"]}
        if len(weights) < 2 or self.job.records("shard"):
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
    def synced_by_hand(self):
        """Whether, without DDP, the script all-reduces (its gradients) before nearly every optimizer
        step, and the replicas end equal: it does what DDP does, itself."""
        rank = min(self.job.ranks) if self.job.ranks else None
        steps = self.job.records("step", rank=rank) if rank is not None else []
        before = (
            {e["step"] for _, e in self.job.records("coll", rank=rank) if e["name"] in REDUCING}
            if steps
            else set()
        )
        ddp = self.job.records("ddp")
        return bool(steps) and not ddp and len(before) >= 0.9 * len(steps) and self.weights_differ == ""

    @functools.cached_property
    def saved_files(self):
        """The torch.save() calls that wrote a file (not a buffer in memory): (rank, record)."""
        return [(r, e) for r, e in self.job.records("save") if e["path"]]

    @functools.cached_property
    def reloads_wrapped(self):
        """Where the script loads module.-prefixed weights into a DDP model, if it does."""
        return next((e["at"] for _, e in self.job.records("load_state") if e["ddp"] and e["prefixed"]), None)

    @functools.cached_property
    def renamed(self):
        """Files written under one name, then renamed into place: the name each ended under."""
        return {
            e["source"]: e["path"] for _, e in self.job.records("write") if e["how"] != "open" and e["source"]
        }

    @functools.cached_property
    def evaluation(self):
        """The evaluation loaders, by id: passed over, no optimizer step on their batches, and a model
        evaluating over them (gradients off, or the DDP model in eval mode). A loop over a loader
        with no model, or none evaluating, is not an evaluation."""
        return {
            i: loader
            for i, loader in self.loaders.items()
            if not loader["training"] and loader["passes"] and loader["evaluating"]
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

    @functools.cached_property
    def evaluated_alike(self):
        """Whether every rank evaluated the very same batches (what each forward without gradients
        was given, compared between ranks): then each has the whole held-out number, exact."""
        seen = [e["eval_inputs"] for _, e in self.job.records("exit")]
        return len(seen) == self.world > 1 and bool(seen[0]) and all(s == seen[0] for s in seen)

    @functools.cached_property
    def evaluated_by_hand(self):
        """Every rank evaluated without a DataLoader (forwards without gradients): (where the first
        run of them began, whether a reducing collective followed each run before the next step or
        the end), on the lowest rank; None if not every rank did, or an evaluation loader is there."""
        if self.evaluation or self.world < 2 or len({r for r, _ in self.job.records("eval")}) < self.world:
            return None
        first, pending = None, None
        for e in self.job.ranks[min(self.job.ranks)]:
            if e["e"] == "eval":
                first, pending = first or e["at"], pending or e
            elif e["e"] == "coll" and e["name"] in REDUCING:
                pending = None
            elif e["e"] in ("step", "exit") and pending:
                return pending["at"], False
        return first, True

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


class Source:
    """The script's files as the job saw them, parsed: what its code says where the run does not show
    it (a line's text, the `if` around a call, what an option decides, the calls no rank reached).
    Evidence only: what a finding makes of it is the rules'."""

    def __init__(self, job):
        self.job = job
        self._trees = {}  # the script's files, parsed

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

    def tree(self, path):
        """The script's file at path, parsed (None if it cannot be)."""
        if path not in self._trees:
            try:
                self._trees[path] = ast.parse(self.job.source(path) or "")
            except (SyntaxError, ValueError):
                self._trees[path] = None
        return self._trees[path]

    def option_uses(self, dest):
        """Where the script uses the value of its option `dest` (args.dest, after args =
        parser.parse_args(), or a name assigned from it): (file:line, the if-test it decides or None,
        the statement's source), in every file of the script's the job has."""
        found = []
        for path in sorted(self.job.sources):
            tree = self.tree(path)
            if tree is None:
                continue
            source = self.job.source(path)
            parsed = {  # the names given parse_args()'s result
                target.id
                for node in ast.walk(tree)
                if isinstance(node, ast.Assign) and isinstance(node.value, (ast.Call, ast.Subscript))
                and re.search(r"parse(_known)?_args\(", ast.get_source_segment(source, node.value) or "")
                for target in node.targets if isinstance(target, ast.Name)
            }  # fmt: skip
            aliases = {
                target.id
                for node in ast.walk(tree)
                if isinstance(node, ast.Assign) and is_option(node.value, parsed, dest, set())
                for target in node.targets if isinstance(target, ast.Name)
            }  # fmt: skip
            tests = {id(node.test): node for node in ast.walk(tree) if isinstance(node, (ast.If, ast.IfExp))}
            for node in ast.walk(tree):
                if not is_option(node, parsed, dest, aliases):
                    continue
                test = next(
                    (t.test for t in tests.values() if any(n is node for n in ast.walk(t.test))), None
                )
                found.append((f"{path}:{node.lineno}", test, (parsed, aliases, path)))
        return found

    def default_from_local_rank(self, arg, reads):
        """Whether the option's default is read from LOCAL_RANK: the script read it (reads: where it was
        read, file:line) inside the add_argument() (or set_defaults()) call that names the option."""
        dest = arg["option"].lstrip("-").replace("-", "_")
        for path in self.job.sources:
            tree, source = self.tree(path), self.job.source(path)
            for node in ast.walk(tree) if tree else ():
                if isinstance(node, ast.Call) and re.search(
                    r"add_argument|set_defaults", ast.get_source_segment(source, node.func) or ""
                ):
                    text = ast.get_source_segment(source, node) or ""
                    if (arg["option"] in text or f"{dest}=" in text) and any(
                        f"{path}:{n}" in reads
                        for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)
                    ):
                        return True
        return False

    def option_set(self, dest):
        """Whether the script assigns args.dest itself after parsing (args.local_rank =
        int(os.environ["LOCAL_RANK"])), where args holds parse_args()'s result."""
        for _, _, (parsed, _, path) in self.option_uses(dest):
            for node in ast.walk(self.tree(path)):
                targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
                for t in targets if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)) else ():
                    if isinstance(t, ast.Attribute) and t.attr == dest and is_parsed(t.value, parsed):
                        return True
        return bool(self.source_lines(rf"setattr\([^,]+,\s*['\"]{dest}['\"]"))

    def decided_guards(self, dest, value):
        """The ifs that test the option `dest` alone (with constants), which every rank, holding the
        same value, decides alike: (file:line, the test's source, True or False, the torch.save lines
        it guards), in order."""
        guards = []
        for at, test, (parsed, aliases, path) in self.option_uses(dest):
            if test is None or any(at2 == at for at2, *_ in guards):
                continue
            known = functools.partial(known_option, parsed=parsed, dest=dest, aliases=aliases, value=value)
            result = decide(test, known)
            if result is UNDECIDED:
                continue
            owner = next(
                n for n in ast.walk(self.tree(path)) if isinstance(n, (ast.If, ast.IfExp)) and n.test is test
            )
            saves = sorted(
                {
                    f"{path}:{n.lineno}"
                    for branch in (
                        (owner.body if result is False else owner.orelse) if isinstance(owner, ast.If) else []
                    )
                    for n in ast.walk(branch)
                    if isinstance(n, ast.Call)
                    and re.search(r"save", ast.get_source_segment(self.job.source(path), n.func) or "", re.I)
                },
                key=by_line,
            )
            source = self.job.source(path)
            acts = any(
                isinstance(n, ast.Call)
                and re.search(SIGNIFICANT, ast.get_source_segment(source, n.func) or "")
                for branch in ((owner.body, owner.orelse) if isinstance(owner, ast.If) else ())
                for statement in branch
                for n in ast.walk(statement)
            )
            guards.append(
                (f"{path}:{test.lineno}", ast.get_source_segment(source, test), bool(result), saves, acts)
            )
        return guards

    def assignments(self, attribute):
        """file:line of every assignment to an attribute of that name in the script's files."""
        return sorted(
            {
                f"{path}:{node.lineno}"
                for path in self.job.sources
                if self.tree(path)
                for node in ast.walk(self.tree(path))
                if isinstance(node, (ast.Assign, ast.AugAssign))
                for t in (node.targets if isinstance(node, ast.Assign) else [node.target])
                if isinstance(t, ast.Attribute) and t.attr == attribute
            },
            key=by_line,
        )

    def source_lines(self, pattern):
        """file:line of every line of the script's files that matches pattern, in order."""
        return [
            f"{path}:{n}"
            for path in sorted(self.job.sources)
            for n, text in enumerate((self.job.source(path) or "").splitlines(), 1)
            if re.search(pattern, text) and not text.lstrip().startswith("#")
        ]

    @functools.lru_cache(maxsize=1)  # noqa: B019 (one Source a judged job)
    def ignores(self):
        """{file:line: the codes its `# check_ddp: ignore[CODE, ...]` comment names}, in every file of the
        script's; a name that is no code is the job's unknown_ignores (a mistake, never a silence)."""
        found = {}
        for path in sorted(self.job.sources):
            for n, codes in silencing(self.job.source(path) or ""):
                found[f"{path}:{n}"] = {code for code in codes if code in RULES}
        for path in sorted(self.job.sources):
            for n, code in unknown_ignores(self.job.source(path) or ""):
                if (f"{path}:{n}", code) not in self.job.unknown_ignores:
                    self.job.unknown_ignores.append((f"{path}:{n}", code))
        return found

    @functools.lru_cache(maxsize=256)  # noqa: B019 (one Source a judged job)
    def filled_without_gradients(self, at):
        """For the collective called at file:line: whether the tensor it is given (its first argument, a
        name) holds numbers made with gradients off: the statements that fill it, in the same function
        (past the one that makes it), or that fill the names it is made of (a stack of sums), all
        inside `with torch.no_grad():` or `torch.inference_mode()` (or a function under either), True;
        all outside, False; None where the code does not say."""
        path, _, n = at.rpartition(":")
        tree, n = self.tree(path), int(n) if n.isdigit() else 0
        call = next(
            (
                node
                for node in ast.walk(tree)
                if tree
                if isinstance(node, ast.Call)
                and node.lineno == n
                and node.args
                and isinstance(node.args[0], ast.Name)
            ),
            None,
        )
        if call is None:
            return None
        functions = [
            node
            for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.lineno <= n <= (node.end_lineno or 0)
        ]
        scope = max(functions, key=lambda node: node.lineno, default=tree)  # the innermost
        quiet = [  # the lines that run with gradients off
            (node.lineno, node.end_lineno or node.lineno)
            for node in [*ast.walk(scope), *functions]
            if isinstance(node, ast.With)
            and any(re.search(r"no_grad|inference_mode", ast.unparse(i.context_expr)) for i in node.items)
            or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and any(re.search(r"no_grad|inference_mode", ast.unparse(d)) for d in node.decorator_list)
        ]

        def fills(name):
            return sorted(
                (
                    node
                    for node in ast.walk(scope)
                    if getattr(node, "lineno", n) < n and fills_name(node, name)
                ),
                key=lambda node: node.lineno,
            )

        seen, lines, names = set(), [], [call.args[0].id]
        while names:
            name = names.pop()
            if name in seen or len(seen) > 8:
                continue
            seen.add(name)
            made = fills(name)
            for node in made[1:] if len(made) > 1 else made:  # past the statement that makes it
                used = [
                    x.id
                    for x in ast.walk(getattr(node, "value", node))
                    if isinstance(x, ast.Name) and x.id != name
                ]
                made_of = [u for u in used if fills(u)]
                done_quietly = any(a <= node.lineno <= b for a, b in quiet)
                if (
                    isinstance(node, ast.Assign) and made_of and not done_quietly
                ):  # a stack of others: theirs decide
                    names += made_of
                else:
                    lines.append(node.lineno)
        if not lines:
            return None
        inside = [any(a <= line <= b for a, b in quiet) for line in lines]
        return True if all(inside) else False if not any(inside) else None

    def assigned_from(self, at):
        """The lines that give a value to the names the statement at file:line reads (name = ..., in the
        same file): where what the line uses came from, one step back. A set of file:line."""
        if not at:
            return set()
        path, _, n = at.rpartition(":")
        tree = self.tree(path)
        if tree is None or not n.isdigit():
            return set()
        used = {
            node.id
            for statement in ast.walk(tree)
            if isinstance(statement, ast.stmt) and statement.lineno == int(n)
            for node in ast.walk(statement)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)
        }
        return {
            f"{path}:{node.lineno}"
            for node in ast.walk(tree)
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign))
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
            if isinstance(target, ast.Name) and target.id in used
        }

    def identifiers(self, pattern):
        """The names the script's code uses (variables, attributes, arguments, its options' names) that
        match pattern, sorted: what it calls things, not what its comments or strings say."""
        found = set()
        for path in self.job.sources:
            for node in ast.walk(self.tree(path) or ast.Module([], [])):
                name = (
                    node.id if isinstance(node, ast.Name)
                    else node.attr if isinstance(node, ast.Attribute)
                    else node.arg if isinstance(node, ast.arg)
                    else None
                )  # fmt: skip
                if name and re.search(pattern, name, re.I):
                    found.add(name)
        return sorted(found)

    def line(self, at):
        """The text of the line at file:line, or "" where the job has no such line."""
        path, _, n = at.rpartition(":")
        try:
            return (self.job.source(path) or "").splitlines()[int(n) - 1]
        except (ValueError, IndexError):
            return ""

    def calls(self, name):
        """The calls of `name` (torch.save, torch.load) in the script's files, reached or not: (file:line,
        {keyword: its value where a constant, else UNDECIDED}), in order."""
        found = {}
        for path in sorted(self.job.sources):
            tree = self.tree(path)
            for node in ast.walk(tree) if tree else ():
                # the call's name as Python reads it (its source segment would split the file at each call)
                if isinstance(node, ast.Call) and ast.unparse(node.func) == name:
                    keywords = {
                        k.arg: k.value.value if isinstance(k.value, ast.Constant) else UNDECIDED
                        for k in node.keywords
                        if k.arg
                    }
                    found[f"{path}:{node.lineno}"] = keywords
        return sorted(found.items(), key=lambda item: by_line(item[0]))


def fills_name(node, name):
    """Whether a statement gives the name a value: name = ..., name += ..., name[...] = ..., or an in-place
    call on it (name.add_(...), name.copy_(...))."""
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return any(
            isinstance(t, ast.Name)
            and t.id == name
            or isinstance(t, ast.Subscript)
            and getattr(t.value, "id", "") == name
            for t in targets
        )
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and getattr(node.value.func.value, "id", None) == name
        and node.value.func.attr.endswith("_")
    )


def silencing(text):
    """Each line of a file whose comment silences findings: (its number, the codes it names, as written).
    Comments only, as Python reads them: not a docstring that shows how."""
    import io
    import tokenize

    try:
        comments = [
            (token.start[0], token.string)
            for token in tokenize.generate_tokens(io.StringIO(text).readline)
            if token.type == tokenize.COMMENT
        ]
    except (tokenize.TokenError, SyntaxError):
        comments = []
    for n, comment in comments:
        for names in re.findall(r"#\s*check_ddp:\s*ignore\[([^\]]*)\]", comment):
            yield n, [c.strip().upper() for c in names.split(",") if c.strip()]


def unknown_ignores(text):
    """The silencing comments' names that are no rule's code: (line, name)."""
    return [(n, code) for n, codes in silencing(text) for code in codes if code not in RULES]


UNDECIDED = object()  # a value the source alone does not tell
# calls whose running or not changes what the job does, not only what it prints
SIGNIFICANT = (
    r"save|init_process_group|DistributedDataParallel|DDP|barrier|all_reduce|broadcast|set_device|cuda|\.to$"
)


def known_option(node, parsed, dest, aliases, value):
    return value if is_option(node, parsed, dest, aliases) else UNDECIDED


def is_parsed(node, parsed):
    """Whether node names parse_args()'s result: args, or self.args."""
    return (isinstance(node, ast.Name) and node.id in parsed) or (
        isinstance(node, ast.Attribute) and node.attr in parsed
    )


def is_option(node, parsed, dest, aliases):
    """Whether node reads the option dest: args.dest, where args holds parse_args()'s result, or an
    alias assigned from it."""
    if isinstance(node, ast.Attribute):
        return node.attr == dest and is_parsed(node.value, parsed) and isinstance(node.ctx, ast.Load)
    return isinstance(node, ast.Name) and node.id in aliases and isinstance(node.ctx, ast.Load)


def decide(node, value_of):
    """The value of an if-test made of known values, constants, comparisons, not/and/or; UNDECIDED
    if any part is not known. value_of(node) gives a known node's value, or UNDECIDED."""
    import operator

    known = value_of(node)
    if known is not UNDECIDED:
        return known
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        items = [decide(e, value_of) for e in node.elts]
        return UNDECIDED if any(i is UNDECIDED for i in items) else tuple(items)
    if isinstance(node, ast.UnaryOp):
        operand = decide(node.operand, value_of)
        if operand is UNDECIDED:
            return UNDECIDED
        return {ast.Not: operator.not_, ast.USub: operator.neg, ast.UAdd: operator.pos}.get(
            type(node.op), lambda _: UNDECIDED
        )(operand)
    if isinstance(node, ast.BoolOp):
        values = [decide(v, value_of) for v in node.values]
        stop = isinstance(node.op, ast.Or)  # or: the first true decides; and: the first false
        for v in values:
            if v is UNDECIDED:
                return UNDECIDED
            if bool(v) is stop:
                return v
        return values[-1]
    if isinstance(node, ast.Compare):
        ops = {
            ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge, ast.In: lambda a, b: a in b,
            ast.NotIn: lambda a, b: a not in b, ast.Is: operator.is_, ast.IsNot: operator.is_not,
        }  # fmt: skip
        left = decide(node.left, value_of)
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = decide(right_node, value_of)
            if left is UNDECIDED or right is UNDECIDED or type(op) not in ops:
                return UNDECIDED
            try:
                if not ops[type(op)](left, right):
                    return False
            except TypeError:
                return UNDECIDED
            left = right
        return True
    return UNDECIDED


# the calls the judge names (CALLS keys)
INIT = "torch.distributed.init_process_group"
BACKWARD = "torch.autograd.backward"
DDP_FORWARD = "torch.nn.parallel.DistributedDataParallel.forward"
ENVIRON_READ = "os._Environ.__getitem__"

COMMUNICATION_ERROR = re.compile(
    r"closed by peer|reset by peer|Connection refused|Timed out|timed out|doesn't match expected size|"
    r"collective mismatch|Broken pipe|NCCL communicator was aborted|Watchdog caught"
)


def crash_step(f, rank, event):
    """The step of the call that raised, where it is a DDP call: a watched call's step (a read of who
    the process is: step 8's; of another variable: none), or step 8 for a line of the script's that
    asks who the process is (a launch variable, the GPUs' count) and raised. SCRIPT for an error of the
    script's own code, a library's, or the script's code a call ran (a model's forward inside DDP's):
    no DDP step's. Never the step the job was in when it failed."""
    call = event.get("call")
    reads = {e["at"] for _, e in f.job.records("read", rank=rank)}
    # the failing line asks who the process is, or uses a name given its value where that was asked
    asked = event.get("at") in reads or bool(reads & f.source.assigned_from(event.get("at")))
    if event.get("within"):  # the script's own code raised, inside the call that ran it
        return SCRIPT
    if call == ENVIRON_READ:
        return 8 if asked else SCRIPT
    if call in CALLS:
        return CALLS[call].step
    return 8 if asked else SCRIPT


# what a rank was doing, told by the last of its records before an error: (words, the call that
# tells it, step)
PHASES = {
    "load": ("while resuming", "torch.load()", 6),
    "load_state": ("while resuming", "load_state_dict()", 6),
    "save": ("while saving", "torch.save()", 6),
    "eval": ("while evaluating", "a forward without gradients", 10),
    "step": ("while training", None, 4),
    "ddp": ("before training", "DDP(...)", 4),
    "met": ("after the group was made, before DDP wrapped the model", None, 3),
}


def crash_phase(facts, rank):
    """What the rank was doing when it failed, from its last telling record: (words, step); the
    words name the call that tells it where it is not the line that failed."""
    crash = facts.crash[1] if facts.crash and facts.crash[0] == rank else {}
    for e in reversed(facts.job.ranks.get(rank, [])):
        if e["e"] == "pass" and e["loader"] in facts.evaluation:
            return "while evaluating", 10
        if e["e"] in PHASES:
            words, call, step = PHASES[e["e"]]
            if call and e.get("at") and e["at"] != crash.get("at"):
                words += f" (after {call} at {e['at']})"
            return words, step
    return "before the process group was made", 8


def needs_gpu(f, rank, event):
    """An error that says CUDA or NCCL is missing (this torch has neither), or that the stand-in lacks
    something, whichever call raised it: the script's own GPU code, torch's, a CUDA extension's,
    Triton's. Not the script's own raise (its check of what it was given), nor a GPU the stand-in
    refused as CUDA or torch would (its gpu record says so), which is the script's."""
    text = f"{event['type']}: {event['message']}" if event else ""
    return bool(
        event
        and event["raised"] != "raise"
        and rank not in f.refused
        and re.search(r"CUDA|NVIDIA|NCCL|nccl|cuda|GPU|[Tt]riton|StandIn|accelerator", text)
        and "SyncBatchNorm" not in event["message"]
        and not re.search(r"out of memory", event["message"])
    )


def own_errors(job):
    """check_ddp's own errors in this job, as lines to show: its bookkeeping's (caught, the script
    went on) and one that stopped the script. Never the script's: the check is incomplete."""
    found = [
        f"check_ddp.py's own error at {e['at']}, caught (your script went on): {e['type']}: "
        f"{short(e['message'])}"
        for _, e in job.records("fault")
    ]
    refused = {r for r, e in job.records("gpu") if e["refused"]}  # the stand-in's refusal: the call's
    found += [
        f"check_ddp.py's own error stopped rank {r}: {e['type']}: {short(e['message'])}"
        for r, e in job.records("crash")
        if e["raised"] == "checker" and r not in refused
    ]
    found += [f"check_ddp.py's own error in its rule {text}" for text in job.judge_errors]
    return list(dict.fromkeys(found))


def short(message):
    """An error's first sentence, without the C++ source locations torch puts in front; for an
    error that carries another process's traceback (mp.spawn's), that process's own error."""
    message = re.sub(r"\[[^\]]*\.(cc|cpp|h|hpp):\d+\]\s*", "", message or "").strip()
    lines = [line for line in message.splitlines() if line.strip()]
    if "Traceback (most recent call last)" in message:
        lines = [line.strip() for line in lines if not line.startswith((" ", "\t"))][-1:]
    first = lines[0] if lines else ""
    if first.endswith(":") and len(lines) > 1:  # "Error(s) in loading state_dict for Net:", and what
        first += " " + lines[1].strip()
    sentence = re.match(r"(.{20,}?[.!])\s", first)  # the first sentence, where a longer text follows
    first = sentence.group(1) if sentence and len(first) > 160 else first
    return first if len(first) <= 160 else first[:157] + "..."


def inner_place(message, job):
    """The script's own file:line that raised, in a traceback carried inside an error, if any."""
    found = None
    for path, line in re.findall(r'File "([^"]+)", line (\d+)', message or ""):
        relative = os.path.relpath(path, job.cwd)
        if job.source(relative) is not None and not relative.startswith(".."):
            found = f"{relative}:{line}"
    return found


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


def ordinal(n):
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def plural(n, word):
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("s") else "s")


# The rules of each step, in the order they are tried. A rule's docstring is its explanation
# (python check_ddp.py --explain CODE): its first line the summary; then what happens, why, and
# what to do.

# What several steps' rules share: ranks that fall out of step (the job hangs, or a rank loses its
# peers). Each cause is the rule of the step the README teaches it in (uneven inputs: DDP307, step 3; a
# collective only some ranks call: DDP508, step 5; one in a rank-only block: DDP609, step 6; an early
# stop each rank decides alone: DDP1007, step 10), a cause the records do not show DDP504's (at the
# end). Each is tried first in its step: a hang explains what else looks wrong.


def fell_out_of_step(f):
    """How the ranks fell out of step, if they did: the text of a hang (where each rank waits),
    or of a rank that lost its peers; None. Asked by the rules after step 1, once step 1 has said
    whether it explains a hang (the ranks never met)."""
    job = f.job
    if job.records("spawn"):
        return None  # processes of the script's own: step 8's
    if job.hung and job.records("met") and "hang" not in f.explained:
        return f"the job stopped making progress ({job.silence:g} s without any): {where_each_waits(f)}"
    if f.crash and COMMUNICATION_ERROR.search(f.crash[1]["message"]) and why_out_of_step(f, hang=False):
        rank, e = f.crash
        return f"rank {rank} lost its peers at {f.code(e['at'])} ({short(e['message'])})"
    # no rank's error: a rank killed (gloo aborts one whose collective's sizes differ), and torchrun
    # stopped the others before their own error came (seen under load)
    if job.returncode and not f.crash and not job.records("exit") and why_out_of_step(f, hang=False):
        return f"the job was stopped, no rank's error recorded: {where_each_was(f)}"
    return None


def where_each_was(f):
    """Each rank's last known place, from its last record that says one: where the main thread
    was (twice a second), or a collective it called since."""
    parts = []
    for rank, events in sorted(f.job.ranks.items()):
        call = at = None
        for e in events:
            if e["e"] == "now" and e["stack"]:
                call, at = e["call"], e["stack"][0]
            elif e["e"] == "coll":
                call, at = f"torch.distributed.{e['name']}", e["at"]
        what = CALLS[call].label if call in CALLS else "its own code"
        parts.append(f"rank {rank} was last in {what} at {f.code(at)}" if at else f"rank {rank}: not known")
    return "; ".join(parts)


def unmatched_text(f):
    i, calls = f.unmatched_collective
    said = [
        f"rank {r} called {'dist.' * (c['name'] in COLLECTIVES)}{c['name']}() at {f.code(c['at'])}"
        if c
        else f"rank {r} called none"
        for r, c in sorted(calls.items())
    ]
    # the script's own, counted in order: DDP's in forward and backward are not among them
    return f"the ranks' {ordinal(i + 1)} collectives of the script's own differ: " + "; ".join(said)


def where_each_waits(f):
    parts = []
    for rank in sorted(f.job.ranks):
        call, at, _ = f.waiting.get(rank, (None, None, []))
        what = CALLS[call].label if call in CALLS else "its own code"
        if call == BACKWARD and f.job.records("ddp"):
            what = "backward(), DDP's gradient all-reduce"
        parts.append(f"rank {rank} waits in {what} at {f.code(at)}" if at else f"rank {rank}: not known")
    return "; ".join(parts) or "no rank started"


def why_out_of_step(f, hang=True):
    """Why the ranks fell out of step, seen from what each did: (what kind of cause, the cause as
    evidence: "rank_block", a collective only some ranks reach; "uneven", ranks with different
    numbers of batches; "early_stop", ranks that left the loop apart; "unmatched", collectives that
    differ between ranks), or None. Each rank's collectives, compared, show it on every run, whether
    the job hung, failed, or (by luck, pairing calls that do not belong together) ended; only a hang shows
    where each rank waits."""
    unmatched = f.unmatched_collective
    apart = sharded_evaluation_apart(f)
    if apart:  # a sharded model's forward without gradients on some ranks only: step 10's
        return "eval_alone", apart
    waiting = f.waiting if hang else {}
    for r, (call, at, _) in sorted(waiting.items()):  # a forward without gradients, through DDP: step 10's
        if call == DDP_FORWARD and evaluating(f, r) and any(c != DDP_FORWARD for c, _, _ in waiting.values()):
            return "eval_alone", (
                f"rank {r} evaluates through the DDP model at {f.code(at)}, and the other ranks do not: "
                "DDP's forward syncs the model's buffers with every rank"
            )
    for r, c in sorted(unmatched[1].items()) if unmatched else ():
        condition = c and f.source.rank_condition(c["at"])
        if condition:
            return (
                "rank_block",
                f"{unmatched_text(f)}: rank {r}'s is inside `{condition}`, which only some ranks meet",
            )
    for _, (call, at, stack) in sorted(f.waiting.items() if hang else ()):
        for line in stack if call and call != BACKWARD else ():
            condition = f.source.rank_condition(line)
            if condition:
                reached = f"{CALLS[call].label} at {at}" + (f", called from {line}," if line != at else "")
                return "rank_block", f"{reached} is inside `{condition}`: only some ranks reach it"
    if not f.job.records("join"):
        for loader in f.loaders.values():
            batches = {r: e["batches"] for r, e in loader["made"].items() if e["batches"] is not None}
            if loader["training"] and len(set(batches.values())) > 1:
                return "uneven", (
                    "the ranks have different numbers of batches an epoch ("
                    + ", ".join(f"rank {r}: {n}" for r, n in sorted(batches.items()))
                    + f", DataLoader at {next(iter(loader['made'].values()))['at']}): uneven inputs, and "
                    "every backward() all-reduces with every rank"
                )
    steps = {r: len([e for e in events if e["e"] == "step"]) for r, events in f.job.ranks.items()}
    if len(set(steps.values())) > 1:
        return "early_stop", (
            "the ranks left the training loop at different steps ("
            + ", ".join(f"rank {r}: {c}" for r, c in sorted(steps.items()))
            + ")"
        )
    epochs = {  # a rank that went on began a pass over the training data that another did not
        r: len([e for e in events if e["e"] == "pass" and e["loader"] in f.training_loaders])
        for r, events in f.job.ranks.items()
    }
    if len(set(epochs.values())) > 1:
        return "early_stop", (
            "the ranks left the training loop in different epochs ("
            + ", ".join(f"rank {r}: {plural(c, 'pass')}" for r, c in sorted(epochs.items()))
            + " over the training data)"
        )
    if unmatched:
        return "unmatched", unmatched_text(f)
    return None


def out_of_step(f, kind):
    """The finding of a rule about ranks falling out of step, when the cause is of its kind (None:
    no cause the records show)."""
    stall = fell_out_of_step(f)
    if stall is None and f.unmatched_collective is None:
        return None
    hang = f.job.hung and "hang" not in f.explained
    cause = why_out_of_step(f, hang=hang)
    if (cause[0] if cause else None) != kind:
        return None
    follows = None
    unmatched = f.unmatched_collective
    if unmatched and kind in (
        "rank_block",
        "unmatched",
    ):  # a metric all-reduced on some ranks only: its step's too
        names = {c["at"] for c in unmatched[1].values() if c and c["name"] in REDUCING}
        said = f"its all-reduce at {', '.join(sorted(names))} is one only some ranks call"
        follows = {
            step: said
            for step, evaluating in ((5, False), (10, True))
            if names
            and set(reduced_sites(f, evaluating=evaluating)) <= names
            and reduced_sites(f, evaluating)
        }
    said = cause[1][0].upper() + cause[1][1:] if cause else ""
    if stall is None:  # the job ended, as if well: the ranks' collectives say otherwise
        return Found(said, follows=follows)
    if hang:
        return Found(stall + (f". {said}" if cause else ""), follows=follows)
    return Found(f"{stall}. {said}", explains=("crash",), follows=follows)


# DDP step 1: init the process group


@rule(
    "DDP101",
    "FAIL",
    launch="follows",
    sets_aside="launch",
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
    launch="follows",
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


@rule(
    "DDP104", "FAIL", help="call dist.init_process_group(backend) first, in every process", launch="follows"
)
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
    # the first step of a conversion: what a script that makes no group does apart follows from it
    return Found(
        f"no rank called dist.init_process_group(): each of the {len(job.ranks)} processes trained alone",
        follows={step: "" for step in (3, 4, 5, 6, 8, 10)},
    )


@rule(
    "DDP105",
    "FAIL",
    launch="follows",
    sets_aside="launch",
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
            f"{f.code(e['at'])} passes init_method={e['init_method']!r}: not where torchrun's job meets",
            explains=f.init_failed,
        )
    return None


@rule(
    "DDP106",
    "FAIL",
    launch="follows",
    sets_aside="launch",
    help="leave rank= and world_size= out: init_process_group() reads them from torchrun",
)
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
                    explains=f.init_failed,
                )
    return None


@rule(
    "DDP107",
    "FAIL",
    launch="follows",
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
    backend = met[0][1]["backend"]
    if backend == "undefined":  # no backend given: torch's default, one per device type
        backend = "the default backend: gloo on CPUs, nccl on GPUs"
    if f.asked_nccl and f.standin:
        backend = f"{inits[0][1]['backend']}, stood in by {backend}"
    return "ok", f"{len(met)} ranks met ({backend}) at {inits[0][1]['at']}, in {seconds:.1f} s"


# DDP step 2: place each process on its device


@rule(
    "DDP201",
    "FAIL",
    see="global_rank_device",
    explains=("crash",),
    sets_aside="layout",
    help="use LOCAL_RANK, the process's number on its node, as the GPU index, not RANK",
)
def device_past_the_node(f):
    """A rank asked for a GPU its node does not have ("invalid device ordinal").

    GPUs are numbered per node, 0 to the node's count - 1. The global rank runs over every node:
    on the second node of 2 x 4 GPUs, rank 4 asks for cuda:4, which is not there. LOCAL_RANK is
    the process's number on its node: use it as the GPU index.
    """
    past = [(r, e) for r, e in f.refused.items() if e["refused"] == "past_node"]
    if past and f.crash:  # the stand-in refused it, as CUDA does
        rank, e = past[0]
        return Found(f"rank {rank} asked for cuda:{e['index']}, a GPU its node lacks, at {f.code(e['at'])}")
    if not f.standin and f.crashed_with("invalid device ordinal"):  # CUDA's own refusal, on GPUs
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
    wrong = {
        r: d
        for r, d in f.model_devices.items()
        if d[0].startswith("cuda") and d != [f"cuda:{f.local_rank(r)}"]
    }
    if wrong and f.on_gpus:
        r, d = sorted(wrong.items())[0]
        return Found(f"rank {r} (LOCAL_RANK {f.local_rank(r)}) has its model on {', '.join(d)}")
    return None


@rule(
    "DDP203",
    "FAIL",
    launch="follows",
    help="take the GPU from LOCAL_RANK: local_rank = int(os.environ['LOCAL_RANK']); "
    "torch.cuda.set_device(local_rank); model.to(local_rank)",
)
def one_gpu_for_a_node(f):
    """The processes of a node would all use one GPU: the GPU index does not come from LOCAL_RANK.

    torchrun starts a process per GPU of a node, and tells each its number on the node in
    LOCAL_RANK. A script that uses cuda:0, .cuda() with no device set, or a local rank it never
    gets from torchrun (--local_rank, which torchrun does not pass), puts every process of a
    node on GPU 0: they share its memory, and nccl refuses two ranks on one GPU. Here either two
    ranks of one node had their models on one GPU, or every rank used GPU 0 and none read
    LOCAL_RANK.
    """
    if not f.on_gpus:
        return None
    by_gpu = {}
    for r, d in f.model_devices.items():
        by_gpu.setdefault((f.starts[r]["node"], d[0]), []).append(r)
    shared = sorted(
        (ranks, key) for key, ranks in by_gpu.items() if len(ranks) > 1 and key[1].startswith("cuda")
    )
    if shared:
        ranks, (node, gpu) = shared[0]
        return Found(f"{ranks_text(ranks)}, on node {node}, have their models on one GPU, {gpu}")
    devices = {d[0] for d in f.model_devices.values()}
    from_node = f.read("LOCAL_RANK") or f.read("device_count")  # rank % torch.cuda.device_count() is fine
    if len(f.model_devices) == f.world > 1 and devices == {"cuda:0"} and not from_node:
        where_asked = next((e["at"] for _, e in f.job.records("gpu") if e["at"]), None)
        return Found(
            f"every rank has its model on cuda:0 ({f.code(where_asked) if where_asked else 'no GPU named'}), "
            "and no rank read LOCAL_RANK: on a node of several GPUs, its processes would all use GPU 0"
        )
    return None


@rule(
    "DDP204",
    "FAIL",
    help="move the model to its GPU before wrapping it: model.to(torch.device('cuda', local_rank))",
)
def model_left_on_cpu(f):
    """The model is on the CPU while the backend is nccl: on GPUs, DDP(...) fails.

    nccl exchanges tensors between GPUs only. A model never moved to its GPU keeps its
    parameters on the CPU, and DDP's first broadcast of them fails (or, moved later by hand,
    trains at CPU speed). Move the model to the process's GPU, then wrap it.
    """
    if f.standin and f.asked_nccl:
        on_cpu = sorted(r for r, d in f.model_devices.items() if d == ["cpu"])
        if on_cpu:
            wrapped = f.job.records("ddp", rank=on_cpu[0]) or f.job.records("shard", rank=on_cpu[0])
            e = wrapped[0][1]
            return Found(
                f"{ranks_text(on_cpu)} wrapped a model whose parameters are on the CPU "
                f"({e.get('how', 'DDP')} at {f.code(e['at'])}), and the backend is nccl"
            )
    return None


@rule(
    "DDP205",
    "FAIL",
    help="move each batch to the model's GPU (x = x.to(device)), or give DDP device_ids=[local_rank], "
    "which moves its inputs",
)
def batches_left_on_cpu(f):
    """The batches reach the model on the CPU while the model is on a GPU: on GPUs, forward() fails.

    A layer's weights and its input must be on one device. With device_ids, DDP moves its inputs
    to the model's GPU itself; without DDP, or without device_ids, they reach the model where
    they are, and on a GPU the first layer fails. Move each batch to the model's GPU.
    """
    if not f.standin:
        return None
    # tensors made from one on a GPU (sliced, cast, stacked) are on it too, and the stand-in cannot follow
    # them: a batch that looks as if on the CPU proves nothing where the script moves data to a GPU at all
    moved = {"to", "cuda", *FACTORIES, "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor"}
    if any(g["how"] in moved for _, g in f.job.records("gpu")):
        return None
    for r, e in f.job.records("input"):
        ddp = f.job.records("ddp", rank=r)
        if e["device"] == "cpu" and e["model"].startswith("cuda") and not (ddp and ddp[0][1]["device_ids"]):
            wrapped = f", and DDP(...) at {f.code(ddp[0][1]['at'])} has no device_ids" if ddp else ""
            return Found(
                f"rank {r}'s batches reach the model on the CPU ({f.code(e['at'])}) while the model is on "
                f"{e['model']}{wrapped}"
            )
    return None


@summary(2)
def step_2_summary(f):
    if not f.on_gpus:
        if f.job.device == "cuda" or f.standin:
            return "--", "not checked: the script runs on the CPU (no GPU asked for)"
        return "--", "not checked: no GPU here"
    if not f.model_devices:
        return "--", "not checked: no model was wrapped in DDP"
    stood_in = " (stood in)" if f.standin else ""
    return "ok", f"each rank's model is on the GPU of its LOCAL_RANK{stood_in}: " + ", ".join(
        f"rank {r} on {d[0]}" + (f" of node {f.starts[r]['node']}" if f.job.nnodes > 1 else "")
        for r, d in sorted(f.model_devices.items())
    )


# DDP step 3: shard the data


@rule(
    "DDP307",
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
    return out_of_step(f, "uneven")


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


def own_parts(loader):
    """Whether each rank's DataLoader holds a dataset of its own: their data, or their lengths, differ."""
    made = loader["made"].values()
    data, lengths = {e["data"] for e in made}, {e["length"] for e in made}
    return (len(data) > 1 and None not in data) or (len(lengths) > 1 and None not in lengths)


def datasets_differ(f, loader, splits=False):
    """The ranks whose copies of the loader's dataset differ, and the message saying so; or None. With
    splits, a Subset of one dataset drawn apart on each rank (random_split seeded by rank) is a dataset
    of its own on each (a split by rank on purpose is another Subset on each too: splits is for a
    sampler that assumes one dataset, DistributedSampler)."""
    made = loader["made"]
    data = {r: (e["data"], e["subset"] if splits else None) for r, e in made.items()}
    if len(set(data.values())) > 1 and None not in (d for d, _ in data.values()):
        at = next(iter(made.values()))["at"]
        split = len({d for d, _ in data.values()}) == 1  # one dataset, split apart on each rank
        what = "the split (the Subset) of one dataset" if split else "the data"
        return (
            f"the ranks built different datasets: {what} under the DataLoader at {f.code(at)} differs "
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
        message = datasets_differ(f, loader, splits=True)
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
    can repeat: (loader, what the shards share), or None. Indices are compared only where they index
    one dataset: a rank that holds a part of its own (each its own list, of its own length) may count
    from 0 as every other does."""
    for loader in f.training_loaders.values():
        passes = whole_passes(loader)
        if len(passes) < 2 or own_parts(loader):
            continue
        some = next(iter(loader["made"].values()))
        for n in range(min(len(p) for p in passes.values())):
            drawn = {r: p[n] for r, p in passes.items()}
            # shares that overlap by design are a sampler of the script's own's (torch's DistributedSampler
            # deals disjoint shards of one dataset: where its shards overlap, the datasets differ)
            if not some["distributed"] and drawn_as_shares(drawn, some["length"], f.world):
                continue
            for k, sets in enumerate(shards_of_a_pass(f, drawn, some["length"])):
                ranks = sorted(sets)
                shared = max(len(sets[a] & sets[b]) for a in ranks for b in ranks if a < b)
                if shared <= f.world - 1:  # no more than DistributedSampler's padding can repeat
                    continue
                length = some["length"]
                when = (
                    f"epoch {n + 1}"
                    if not k
                    else f"the {ordinal(k + 1)} pass over the data of a never-ending stream"
                )
                if all(sets[r] == sets[ranks[0]] for r in ranks) and length and len(sets[ranks[0]]) >= length:
                    what = f"{ranks_text(ranks)} each drew all {length} samples in {when}"
                else:
                    what = (
                        f"in {when} the shards of {ranks_text(ranks)} share {shared} of their "
                        f"{min(len(s) for s in sets.values())} samples"
                    )
                return (
                    loader,
                    f"{what} (DataLoader at {f.code(some['at'])}): each rank trains on the same data",
                )
    return None


def drawn_as_shares(drawn, length, world):
    """Whether each rank drew a share of the data of its own, as a sampler that shards by rank does: no
    more draws than the data's size / N, and no two ranks alike. Shares that overlap are then the
    sampler's design (repeated augmentation deals a sample to several ranks, each to augment it its own
    way), not unsharded data: with no DistributedSampler each rank draws the whole data; ranks told the
    wrong world (num_replicas=1) draw it whole too, or alike."""
    sequences = [tuple(indices) for indices in drawn.values()]
    share = -(-(length or len(set().union(*sequences))) // max(1, world))
    return len(set(sequences)) == len(sequences) and all(len(s) <= share for s in sequences)


def shards_of_a_pass(f, drawn, length):
    """Each rank's shards of one pass, as sets, to compare between ranks: the pass itself, or, for a
    sampler that never ends (a pass over many epochs' worth of data, as detectron2's and DINO's
    stream indices), its consecutive windows of one epoch's share each, the data's size / N."""
    size = length or len(set().union(*map(set, drawn.values())))
    share = -(-size // max(1, f.world))
    if not share or max(map(len, drawn.values())) <= size + f.world:  # no more than the data: an epoch
        return [{r: set(d) for r, d in drawn.items()}]
    windows = min(len(d) for d in drawn.values()) // share
    return [{r: set(d[k * share : (k + 1) * share]) for r, d in drawn.items()} for k in range(windows)]


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
    launch="follows",
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
    launch="follows",
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
        longest = max(map(len, orders), default=0)
        if not longest:
            continue  # passes whose indices the check did not see
        how = "DistributedSampler" if some["distributed"] else some["sampler"]
        first = {r: p[0] for r, p in passes.items() if p}
        shared = max((len(set(a) & set(b)) for a, b in itertools.combinations(first.values(), 2)), default=0)
        repeats = 0  # samples the sampler draws again to even the shards: then they are not disjoint
        if (
            shared > f.world - 1
            and not some["distributed"]
            and drawn_as_shares(first, some["length"], f.world)
        ):
            detail = (
                f"{how}: shares of {longest} draws a rank that overlap by the sampler's design, each rank's "
                "its own (repeated augmentation: each copy augmented anew)"
            )
        else:
            repeats = sum(len(set(p)) for p in first.values()) - len(set().union(*first.values()))
            detail = f"{how}: {'shards' if repeats else 'disjoint shards'} of {longest} samples a rank"
        if some["length"]:
            detail += f", of {some['length']}"
        if repeats:
            detail += f", {plural(repeats, 'sample')} drawn again by another rank"
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
    "DDP403",
    "FAIL",
    launch="follows",
    help="model = DDP(model, device_ids=[local_rank]) (no device_ids on a CPU), after moving it to its "
    "device",
)
def not_wrapped(f):
    """No rank wrapped its model in DDP: the ranks train apart, each its own replica.

    Without DDP nothing averages the gradients: each rank takes its own steps on its own shard,
    and the replicas drift apart. The job trains N different models, each on 1/N of the data.
    Wrap the model in DDP once it is on its device. (A script that averages the gradients itself,
    all-reducing them before each step, keeps the replicas equal: that is no mistake.)
    """
    wrapped = f.job.records("ddp") or f.job.records("shard")
    if f.job.records("step") and not wrapped and not f.synced_by_hand:
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
    "DDP408",
    "FAIL",
    see="optimizer_before_shard",
    help="build the optimizer after fully_shard(model), from model.parameters(): the sharded parameters",
)
def sharded_model_never_changed(f):
    """The optimizer steps changed no parameter of the sharded model: it holds the ones sharding replaced.

    fully_shard() (FSDP2) puts new parameters in the model's place, each this rank's shard (a
    DTensor). An optimizer built before it holds the old ones, which no forward uses any more: its
    steps move nothing the model computes with, without a word, and the loss stays where it was.
    Build the optimizer after sharding, from model.parameters(). (Seen by its effect: every rank's
    shards, summed as they are held, are what they were when sharded, after the optimizer steps.)
    """
    if sharded_unchanged(f):
        e = f.job.records("shard")[-1][1]
        steps = max((x["steps"] for _, x in f.job.records("exit")), default=0)
        events = f.job.ranks[min(f.job.ranks)]
        sharded_at = max(i for i, x in enumerate(events) if x["e"] == "shard")
        before = [x for x in events[:sharded_at] if x["e"] == "optim"]
        made = f" the optimizer made at {f.code(before[0]['at'])}, before sharding," if before else ""
        return Found(
            f"after {plural(steps, 'optimizer step')}, no rank's shards of the model sharded at "
            f"{f.code(e['at'])} changed:{made} steps parameters the model no longer uses"
        )
    return None


def sharded_unchanged(f):
    """Whether the sharded model's parameters, as each rank holds them, are at the end what they were
    when sharded, after optimizer steps (True), changed (False), or not known (None)."""
    shards = {r: e for r, e in f.job.records("shard")}
    ends = {r: e for r, e in f.job.records("exit") if e["sharded"] is not None and e["steps"]}
    if not shards or not ends or set(ends) - set(shards):
        return None
    return all(ends[r]["sharded"] == shards[r]["local"] for r in ends)


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
    shards = job.records("shard")
    if shards and not job.records("ddp"):  # one copy, sharded: its effect is that training changed it
        e = shards[-1][1]
        changed = (
            "changed by training"
            if sharded_unchanged(f) is False
            else "not checked whether training changed it"
        )
        return "ok", (
            f"{e['how']}() of {e['module']} at {e['at']}, one copy of the weights sharded over "
            f"{plural(e['ranks'] or len(job.ranks), 'rank')}, {changed}"
            + (f" ({plural(total, 'optimizer step')})" if total else "")
        )
    if not job.records("ddp"):  # the gradients all-reduced by hand (else DDP403): the replicas equal
        return "ok", "no DDP, and the replicas are equal at the end: the script averages the gradients itself"
    equal = "the replicas are equal at the end" if f.weights_differ == "" else "every forward went through it"
    return "ok", f"DDP at {job.records('ddp')[0][1]['at']}; {equal}" + (
        f" ({plural(total, 'optimizer step')})" if total else ""
    )


# DDP step 5: all-reduce the metrics


@rule(
    "DDP508",
    "FAIL",
    see="rank_zero_collective",
    help="every rank must call the same collectives, in the same order: take each out of any branch only "
    "some ranks take",
)
def collectives_differ(f):
    """The ranks called different collectives: a call one rank makes and another does not.

    A collective pairs each rank's call with the other ranks' calls in the order they come. When
    one rank calls all_reduce where another calls barrier, or nothing, the calls that meet do not
    belong together: the job hangs, fails on mismatched sizes, or (worse) goes on with numbers
    that mean nothing. Compared rank by rank, the first call that differs is where they part.
    """
    return out_of_step(f, "unmatched")


@rule(
    "DDP506",
    "warn",
    launch="follows",
    see="metrics",
    help="sum (loss x samples, samples) on each rank, then dist.all_reduce() it, once an epoch",
)
def metrics_not_reduced(f):
    """No metric is all-reduced: what rank 0 reports is its own shard's.

    Each rank computes its loss on its own shard. A loss printed by rank 0 without an
    all-reduce is an estimate from 1/N of the data. Sum (loss x samples, samples) on each rank,
    all-reduce the sums, and divide.
    """
    job = f.job
    if not job.ranks:
        return None
    epochs = len(
        [e for _, e in job.records("pass", rank=min(job.ranks)) if e["loader"] in f.training_loaders]
    )
    if (f.crash or job.hung or job.returncode) and epochs < 2:
        return None  # stopped before an epoch's end, where the sums would be all-reduced: no evidence
    if not job.records("step") or f.world < 2:
        return None
    if not reduced_sites(f):
        return Found("no metric is all-reduced: what rank 0 reports is its own shard's")
    reads = training_reads(f)
    if reads and not reduced_sites(f, evaluating=False):  # only the held-out sums are: DDP step 10's
        return Found(
            f"the training loss read at {f.code(reads[0])} is never all-reduced: what rank 0 reports of "
            f"training is its own shard's (the all-reduce at "
            f"{' and '.join(reduced_sites(f, evaluating=True))} follows the evaluation: DDP step 10's)"
        )
    return None


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
    # more than once an epoch, where the epochs are known (the training loader's passes); else 8 steps
    epochs = sum(len(whole_passes(loader).get(min(job.ranks), [])) for loader in f.training_loaders.values())
    if n < (max(3, epochs + 1) if epochs else 8):
        return None
    sites = {}
    for _, e in job.records("coll", rank=min(job.ranks)):
        sites.setdefault((e["name"], e["at"]), set()).add(e["step"])
    every_step = [
        f"dist.{name}() at {f.code(at)}"
        for (name, at), at_steps in sites.items()
        if len(at_steps) >= 0.9 * n
        and name in ("all_reduce", "reduce", "all_gather", "barrier")
        and not (f.synced_by_hand and name == "all_reduce")  # the gradients' own all-reduce, done by hand
    ]
    items = {}
    for _, e in steps:
        for at in e["items"]:
            items[at] = items.get(at, 0) + 1
    every_step += [f".item() at {f.code(at)}" for at, count in items.items() if count >= 0.9 * n]
    if every_step:
        return Found(f"a host sync at every one of {n} optimizer steps, for logging: {'; '.join(every_step)}")
    return None


def reduced_sites(f, evaluating=None):
    """Where the lowest rank called a reducing collective: all of them, or (evaluating=True/False)
    those after an evaluation began and before training went on (DDP step 10's), or the others."""
    found, now = set(), False
    for e in f.job.ranks.get(min(f.job.ranks), []) if f.job.ranks else []:
        if e["e"] == "eval" or (e["e"] == "pass" and e["loader"] in f.evaluation):
            now = True
        elif e["e"] == "step" or (e["e"] == "pass" and e["loader"] in f.training_loaders):
            now = False
        elif e["e"] == "coll" and e["name"] in REDUCING:
            # whose the reduced tensor is: where the script filled it, with gradients off (the held-out
            # numbers) or on (training's); where the code does not say, what the job was doing
            held_out = f.source.filled_without_gradients(e["at"])
            if evaluating in (None, now if held_out is None else held_out):
                found.add(e["at"])
    return sorted(found, key=by_line)


def training_reads(f):
    """Where the lowest rank read a value on the host (.item()) at most of its optimizer steps: a training
    metric, most read first."""
    steps = f.job.records("step", rank=min(f.job.ranks))
    counts = collections.Counter(at for _, e in steps for at in e["items"])
    return [at for at, n in counts.most_common() if n >= 0.5 * len(steps)]


@summary(5)
def step_5_summary(f):
    job = f.job
    steps = job.records("step", rank=min(job.ranks)) if job.ranks else []
    if not steps:
        return "--", "not checked: no optimizer step ran"
    reduced = reduced_sites(f, evaluating=False)
    if not reduced_sites(f):
        return "--", "not checked: no metric was all-reduced before the job stopped"
    if not reduced:  # the held-out numbers alone: DDP step 10's
        return "ok", f"all-reduced after evaluating only, at {' and '.join(reduced_sites(f))} (DDP step 10)"
    calls = sum(1 for _, e in job.records("coll", rank=min(job.ranks)) if e["at"] in reduced)
    return (
        "ok",
        f"all-reduced at {' and '.join(reduced)}: {plural(calls, 'call')} in "
        f"{plural(len(steps), 'optimizer step')}",
    )


# DDP step 6: checkpoint on rank 0


@rule(
    "DDP609",
    "FAIL",
    see="rank_zero_collective",
    help="take the collective out of the rank-only block: every rank must call it",
)
def collective_in_rank_block(f):
    """A collective inside a rank-only block (if rank == 0:): the other ranks never reach it.

    A collective (all_reduce, barrier, broadcast, and DDP's own, in forward and backward)
    returns only once every rank has called it. Called inside `if rank == 0:`, it waits forever
    for ranks that took the other branch; they meanwhile wait in their next collective. Or the
    two meet, out of step: on gloo, rank 0's call and another rank's next one (DDP's gradient
    all-reduce) exchange tensors of different sizes, and the job aborts ("Received data size
    doesn't match expected size"). Take the collective out of the block: every rank calls it,
    and only the writing stays on rank 0.
    """
    found = out_of_step(f, "rank_block")
    unmatched = f.unmatched_collective
    gathers = {"get_model_state_dict", "get_optimizer_state_dict", "get_state_dict"}
    if found and unmatched and any(c and c["name"] in gathers for c in unmatched[1].values()):
        found.see = "full_state_dict_rank_zero"  # a sharded model's state gathered in it: FSDP's pitfall
    return found


@rule(
    "DDP614",
    "FAIL",
    see="sharded_state_dict",
    help="gather the full state dict on every rank (get_model_state_dict(model, options=StateDictOptions("
    "full_state_dict=True, cpu_offload=True))), and save it on rank 0; or save every rank's shards with "
    "torch.distributed.checkpoint",
)
def sharded_state_dict_saved(f):
    """A checkpoint holds a sharded model's state_dict(): DTensors, this rank's shards, not the model.

    A sharded model's state_dict() gives each rank's own shards, as DTensors: the full shapes, and
    only this rank's rows. Saved by one rank, the file holds a part of each parameter, which neither
    the single-GPU script (torch.load refuses DTensors with weights_only=True) nor the same job (the
    other ranks' rows are lost) can load. Gather the full state dict on every rank, a collective, and
    save it on rank 0; or save every rank's shards with torch.distributed.checkpoint.
    """
    for _, e in f.saved_files:
        if e["what"].get("sharded"):
            n = e["what"]["sharded"]
            return Found(
                f"{f.job.relpath(f.renamed.get(e['path'], e['path']))} saved at {f.code(e['at'])} holds "
                f"{plural(n, 'DTensor')}: the shards of the rank that saved it, not the model"
            )
    return None


@rule(
    "DDP611",
    "FAIL",
    explains=("crash",),
    help="save plain data in a checkpoint: tensors, numbers, strings, and lists and dicts of them "
    "(vars(args), not args; float(x), not a numpy number); or load inside "
    "torch.serialization.safe_globals([...]), naming what it holds",
)
def resume_cannot_load(f):
    """A checkpoint the script's own torch.load refuses: its resume cannot load what it saved.

    Since torch 2.6, torch.load(path) loads with weights_only=True: tensors, numbers, strings, and
    lists, tuples and dicts of them, nothing that names a class or a function to call while it
    unpickles. A checkpoint that holds more (an argparse.Namespace, a numpy number or array, an
    object of a class of the script's) saves without a word, and the resume that loads it fails with
    UnpicklingError: the run that saves never shows it, and a job restarted after a crash cannot
    continue. The check reads each saved file back as torch.load(weights_only=True) reads it, and
    finds the script's torch.load calls in its code, reached by the run or not. Save plain data, or
    load inside torch.serialization.safe_globals([...]).
    """
    version = max((e.get("torch") or "0.0" for e in f.starts.values()), default="0.0")
    default = tuple(int(x) for x in re.findall(r"\d+", version)[:2]) >= (2, 6)  # weights_only's default
    if f.source.source_lines(r"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        return None
    allowed = " ".join(f.source.line(at) for at in f.source.source_lines(r"safe_globals\("))
    loads = f.source.calls("torch.load")
    refusing = [at for at, keywords in loads if keywords.get("weights_only", default) is True]
    if not refusing or len(refusing) < len(loads):  # a load that may take it: the resume's, perhaps
        return None
    for _, e in f.saved_files:
        names = [n for n in e["unsafe"] or () if n.rpartition(".")[2] not in allowed]
        if names and (e["what"]["models"] or e["what"]["optimizer"]):
            crashed = f.crashed_with("Weights only load failed")
            what = e["unsafe_at"] or ", ".join(names)
            return Found(
                f"{f.job.relpath(f.renamed.get(e['path'], e['path']))} saved at {f.code(e['at'])} holds "
                f"{what}, which torch.load refuses, and the script's own torch.load at {f.code(refusing[0])} "
                "loads "
                "with weights_only=True (torch's default since 2.6): the resume cannot load its own "
                "checkpoint" + (f" (rank {f.crash[0]} failed on it)" if crashed else ""),
                explains=("crash",) if crashed else (),
            )
    return None


@rule(
    "DDP601",
    "FAIL",
    see="unsafe_load",
    help="load with weights_only=True (the default since torch 2.6): a file anyone could have put there is "
    "a stranger's, and its pickle runs as you",
)
def unsafe_load(f):
    """torch.load(..., weights_only=False) of a file another process could have written: it runs its code.

    A checkpoint is a pickle; with weights_only=False, unpickling it may call any function it
    names. A file in a folder anyone on the machine may write to (/tmp, /dev/shm) that this job did
    not save could have been put there, or replaced, by another user's process: loading it so runs
    their code, as you, on every rank. Load with weights_only=True, and save plain data (a
    state_dict(), not the model object). A file of your own that you trust is DDP613's, a warning.
    """
    saved = {e["path"] for _, e in f.job.records("save")} | set(f.renamed.values())
    for _, e in f.job.records("load"):
        if e["weights_only"] is False and e["shared"] and e["path"] not in saved:
            return Found(
                f"{f.code(e['at'])} loads {e['path']} with weights_only=False, from a folder anyone on the "
                "machine may write to, and this job did not save it: loading it runs any code it names"
            )
    return None


@rule(
    "DDP602",
    "FAIL",
    see="every_rank_saves",
    launch="follows",
    help="save on global rank 0 alone: if dist.get_rank() == 0: torch.save(...) (a test of LOCAL_RANK is "
    "true once per node), with no collective inside",
)
def every_rank_saves(f):
    """Several processes save the same checkpoint file at once: every rank, or one per node.

    The replicas are equal, so one copy is all there is to save; processes writing one file at
    the same moment may leave it torn, and on a shared folder they contend for it. A save under
    `if local_rank == 0:` runs once per node: on one machine it looks right, on two it is two
    writers. Save on global rank 0 alone, dist.get_rank() == 0 (and keep any collective outside
    that block).
    """
    by_path = {}
    for rank, e in f.job.records("save"):
        by_path.setdefault(f.renamed.get(e["path"], e["path"]), {})[rank] = e
    for path, savers in sorted(by_path.items(), key=lambda item: str(item[0])):
        if path and len(savers) > 1:
            e = next(iter(savers.values()))
            nodes = {f.starts[r]["node"] for r in savers}
            if (
                len(nodes) == len(savers)
                and {f.local_rank(r) for r in savers} == {0}
                and len(savers) < f.world
            ):
                who = f"{ranks_text(savers)}, local rank 0 of each node,"
            elif len(nodes) == len(savers) == f.job.nnodes > 1:
                who = f"{ranks_text(savers)}, one on each node,"
            else:
                who = f"{ranks_text(savers)} {both(savers)}"
            return Found(
                f"{who} saved {f.job.relpath(path)} at {f.code(e['at'])}: several processes write the same "
                "file at once (on a shared folder, one per node at the least)"
            )
    return None


@rule(
    "DDP612",
    "FAIL",
    launch="follows",
    explains=("crash",),
    help="make the folder and write the file on global rank 0 alone (if dist.get_rank() == 0:), or give each "
    "rank a path of its own; os.makedirs(path, exist_ok=True) where every rank needs the folder",
)
def ranks_race_for_a_path(f):
    """Several ranks make or write one path at once, and one of them fails on it.

    The second rank to call os.makedirs(path) finds it taken (FileExistsError); a file one rank
    renames into place, or removes, is gone when another reaches for it (FileNotFoundError). Which
    rank fails is the luck of the moment: a job that ran once fails the next time, or on another
    file system, wherever it happens to be (saving, evaluating). Make folders and write files on
    global rank 0 alone, or give each rank a path of its own.
    """
    if not f.crash or not f.crash[1]["path"]:
        return None
    rank, e = f.crash
    touched = {}
    for r, w in f.job.records("write"):
        if w["path"] == e["path"]:
            touched.setdefault(r, w)
    if len(touched) < 2:
        return None
    first = touched[min(touched)]
    return Found(
        f"{ranks_text(touched)} {both(touched)} make or write {f.job.relpath(e['path'])} at "
        f"{f.code(first['at'])}: rank {rank} failed on it ({e['type']}: {short(e['message'])})"
    )


@rule(
    "DDP610",
    "FAIL",
    launch="follows",
    help="write the file from one rank (if dist.get_rank() == 0:), or name one file per rank",
)
def several_ranks_overwrite(f):
    """Several ranks write the same file over (a log, settings, results): it ends torn, or as one rank's.

    Each process opens the file to write it whole, at about the same moment: they truncate each
    other's work, and what is left is one rank's, or a mix. On several nodes sharing a folder, a
    guard on the local rank still leaves one writer per node. Write from global rank 0 alone, or
    give each rank a file of its own.
    """
    saved = {f.renamed.get(e["path"], e["path"]) for _, e in f.saved_files} | {
        e["path"] for _, e in f.saved_files
    }
    writers = {}
    for rank, e in f.job.records("write"):
        if e["mode"] == "overwrite" and e["path"] not in saved and e["path"] not in f.empty_files:
            writers.setdefault(f.renamed.get(e["path"], e["path"]), {})[rank] = e
    for path, by in sorted(writers.items()):
        if len(by) > 1:
            e = next(iter(by.values()))
            return Found(f"{ranks_text(by)} {both(by)} wrote {f.job.relpath(path)} over at {f.code(e['at'])}")
    return None


@rule("DDP603", "warn", see="wrapped_state_dict", help="save model.module.state_dict(), the model DDP wraps")
def wrapped_state_dict(f):
    """The checkpoint holds the DDP wrapper's state_dict(): every key starts with module.

    DDP keeps the model as its attribute module, so its state_dict() prefixes every key with
    "module.". Only a DDP-wrapped model loads that: the baseline, an evaluation script, a
    single-GPU run fail with missing and unexpected keys. (If the script itself loads it into a
    bare model, that load fails, and the report shows the error.) Save model.module.state_dict().
    """
    for _, e in f.saved_files:
        if e["what"]["module_prefix"] and not f.reloads_wrapped:
            return Found(
                f"the model keys saved at {f.code(e['at'])} start with module.: the state_dict() of the DDP "
                "wrapper, which only a DDP model loads"
            )
    return None


@rule(
    "DDP608",
    "warn",
    see="wrapped_state_dict",
    help="save model.module.state_dict(), and load it into model.module (or before wrapping): then any "
    "script and any world size loads it",
)
def wrapped_state_dict_reloaded(f):
    """The checkpoint holds module. keys, which the script loads back into its DDP model: for it alone.

    The script saves the DDP wrapper's state_dict() and loads it into a DDP model again, so its
    own resume works. Nothing else can load the file as it is: the baseline, an evaluation
    script, the bare model. Save and load model.module's state instead.
    """
    for _, e in f.saved_files:
        if e["what"]["module_prefix"] and f.reloads_wrapped:
            at = f.reloads_wrapped
            return Found(
                f"the model keys saved at {f.code(e['at'])} start with module., and the script loads them "
                f"back into its DDP model at {f.code(at)}: its own resume works, nothing else loads the file"
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
        if e["how"] != "os.mkdir" and e["path"] not in f.empty_files:
            writers.setdefault(e["path"], {})[rank] = e
    for path, by in sorted(writers.items()):
        if len(by) > 1:
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
    saves = f.saved_files
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
    saves = f.saved_files
    if saves and not any(s["what"]["optimizer"] for _, s in saves):
        return Found(
            f"the checkpoint saved at {f.code(saves[0][1]['at'])} holds no optimizer state: training cannot "
            "resume exactly from it"
        )
    return None


@rule(
    "DDP613",
    "warn",
    see="unsafe_load",
    help="load with weights_only=True where the file holds plain data; where it must be False, load only "
    "files you wrote, and say so: # check_ddp: ignore[DDP613]",
)
def trusted_load_runs_code(f):
    """torch.load(..., weights_only=False): the file's pickle may run code; a choice, for a file you trust.

    With weights_only=False, unpickling may call any function the file names. For a checkpoint
    the script wrote itself, or a pretrained file it ships with, that is a choice with a risk, as a
    linter's security rules treat it: a warning, not a broken step. It becomes DDP601, a FAIL,
    where the file sits in a folder anyone may write to. Save plain data and load with
    weights_only=True; or keep False for your own files, and say so with `# check_ddp:
    ignore[DDP613]` on the line.
    """
    for _, e in f.job.records("load"):
        if e["weights_only"] is False:
            return Found(
                f"{f.code(e['at'])} loads with weights_only=False: unpickling it may run code it names"
            )
    for at, keywords in f.source.calls("torch.load"):
        if keywords.get("weights_only") is False:
            return Found(
                f"{f.code(at)} loads with weights_only=False (not reached in this run): unpickling it may "
                "run code it names"
            )
    return None


@summary(6)
def step_6_summary(f):
    saves = f.saved_files
    if not saves:
        made = {e["at"] for _, e in f.job.records("save")}
        unreached = [at for at, _ in f.source.calls("torch.save") if at not in made]
        if unreached:
            return "--", f"not checked: no rank reached the torch.save() at {', '.join(unreached[:3])}"
        return "--", "not checked: the script saved nothing with torch.save()"
    names = sorted({os.path.basename(f.renamed.get(s["path"], s["path"]) or "?") for _, s in saves})
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    ranks = sorted({r for r, _ in saves})

    # what the files hold, as recorded: a finding silenced (ignore[DDP603]) leaves its fact standing
    def holds(key):
        return any(s["what"][key] for _, s in saves)

    held = " and ".join(name for name, key in (("model", "models"), ("optimizer", "optimizer")) if holds(key))
    prefix = "keys with the wrapper's module. prefix" if holds("module_prefix") else "no module. prefix"
    return "ok", (
        f"{ranks_text(ranks)} alone saved {shown} at {saves[0][1]['at']}: "
        f"{held + ' state' if held else 'no model or optimizer state'}, {prefix}"
    )


# DDP step 7: clean up


@rule(
    "DDP701",
    "FAIL",
    help="on gloo, torch 2.13 can hang as a process frees its DDP model (pytorch/pytorch#190489); else "
    "something still runs as Python exits (a thread, a worker pool): end it",
)
def stuck_at_exit(f):
    """Every rank finished its script, but a process did not end: the job never ends by itself.

    Something still ran as Python exited: a thread that is not a daemon, a worker pool never
    closed, or, on gloo with torch 2.13, the DDP model freed during shutdown
    (pytorch/pytorch#190489; gc.collect() after training avoids it). A job that does not end
    holds its GPUs until something kills it, and a job the check had to stop is never a pass.
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
    launch="root",
    explains=("hang",),
    help="drop the launch in the script (mp.spawn, mp.Process): run the training function once, reading "
    "RANK, LOCAL_RANK and WORLD_SIZE from the environment torchrun makes; launch with torchrun",
)
def starts_own_processes(f):
    """The script starts its own processes (mp.spawn, mp.Process) under torchrun.

    torchrun already starts one process per GPU. A script that starts its own from each of them
    makes N x N processes for a world of N, each group of which tries to meet on its own: they
    hang, or fight over the port. Run the training function once per process, reading who it
    is from the environment torchrun made. (The check starts no processes: each of torchrun's
    runs the one child it stands for, child LOCAL_RANK, in itself; the other steps report what
    that child did.)
    """
    for _, e in f.job.records("spawn"):
        return Found(
            f"{f.code(e['at'])} starts its own processes ({e['how']}): under torchrun each of the "
            f"{len(f.job.ranks)} processes is already one of the job's, and would start a job of its own "
            "(the check ran in each the one child it stands for)"
        )
    return None


def unpassed_local_rank(f):
    """--local_rank (or --local-rank), which torchrun never passes, used for what the job did:
    (its record, what its default did, {step: what of that step follows from it}). None where no
    rank used the default for anything: an option declared and never read is no mistake."""
    local = [(r, e) for r, e in f.job.records("arg") if "local" in e["option"] and not e["given"]]
    if not local or len({r for r, _ in local}) < len(f.job.ranks):
        return None
    reads = {e["at"] for _, e in f.job.records("read") if e["key"] == "LOCAL_RANK" and e["found"]}
    if len({json.dumps(e["value"]) for _, e in local}) > 1 or f.source.default_from_local_rank(
        local[0][1], reads
    ):
        return None  # a default read from LOCAL_RANK (default=int(os.environ["LOCAL_RANK"])): torchrun's
    e = local[0][1]
    dest = e["option"].lstrip("-").replace("-", "_")
    if f.source.option_set(dest):
        return None  # the script sets it itself after parsing (from LOCAL_RANK, most often)
    uses = {at for at, _, _ in f.source.option_uses(dest)}
    effects, follows, crashed = [], {}, False
    gpus = [g for _, g in f.job.records("gpu") if g["at"] in uses]
    if gpus:
        effects.append(f"every rank took cuda:{gpus[0]['index']} from it ({f.code(gpus[0]['at'])})")
        follows[2] = f"every rank's GPU comes from {e['option']}, which torchrun does not pass"
    if f.crash and f.crash[1]["at"] in uses:
        r, c = f.crash
        effects.append(f"rank {r} failed with it at {f.code(c['at'])}: {c['type']}: {short(c['message'])}")
        crashed = True
    ranks = [i for _, i in f.job.records("init") if i["rank"] == e["value"] and i["at"] in uses]
    if ranks:
        effects.append(f"every rank passed rank={e['value']!r} to init_process_group() at {ranks[0]['at']}")
        follows[1] = f"the rank passed to init_process_group() is {e['option']}'s default"
    for at, text, result, saves, acts in f.source.decided_guards(dest, e["value"]):
        if acts:
            effects.append(f"`if {text}:` at {at} is {result} on every rank")
        if saves:
            where_saved = ", ".join(saves)
            effects[-1:] = [f"{effects[-1]}: no rank reaches the save at {where_saved}"] if acts else []
            follows[6] = f"no rank reaches the save at {where_saved} (`if {text}:` is {result} on every rank)"
    return (e, effects, follows, crashed) if effects else None


@rule(
    "DDP805",
    "FAIL",
    launch="root",
    explains=("crash",),
    help="read who the process is from the environment: local_rank = int(os.environ['LOCAL_RANK']) (the old "
    "torch.distributed.launch passed --local_rank; torchrun sets LOCAL_RANK, RANK and WORLD_SIZE)",
)
def rank_from_arguments(f):
    """The script numbers its processes itself (--local_rank, --rank, its own settings), not as torchrun does.

    The old launcher, torch.distributed.launch, passed --local_rank=N to each process; torchrun
    sets LOCAL_RANK, RANK and WORLD_SIZE in the environment instead, and passes nothing. A
    --local_rank option keeps its default in every process (all on one GPU, or all believing
    they are the node's first); a --rank on the command line, or a rank the script works out
    from settings of its own (node rank x GPUs + GPU), is the same in every process: all claim
    one rank. Read who the process is from the environment.
    """
    records = f.job.records("arg")
    unpassed = unpassed_local_rank(f)
    if unpassed:
        e, effects, follows, crashed = unpassed
        return Found(
            f"{f.code(e['at'])} reads {e['option']}, which torchrun does not pass: every rank got its "
            f"default, {e['default']!r}"
            + ("" if f.read("LOCAL_RANK") else ", and no rank read LOCAL_RANK")
            + "; "
            + "; ".join(effects),
            follows=follows,
            explains=("crash",) if crashed else (),
        )
    # ranks numbered on the command line: several passed the one --rank they were all given to
    # init_process_group() (a rank taken from torchrun's LOCAL_RANK instead is step 1's: DDP106)
    inits = {r: e for r, e in f.job.records("init") if e["rank"] not in (None, -1)}
    values = {e["rank"] for e in inits.values()}
    if len(inits) > 1 and len(values) == 1:
        value = values.pop()
        option = next((a for _, a in records if "local" not in a["option"] and a["value"] == value), None)
        if option is not None:
            return Found(
                f"{f.code(option['at'])} takes the rank from {option['option']}: {ranks_text(inits)} all "
                f"passed rank={value!r} to init_process_group(), where torchrun numbers its processes in "
                "RANK",
                explains=("crash", "hang"),
            )
    return None


@rule(
    "DDP807",
    "FAIL",
    launch="root",
    help="read who the process is from torchrun's variables: RANK, LOCAL_RANK, WORLD_SIZE (or support both "
    "launchers: try torchrun's first)",
)
def rank_from_another_launcher(f):
    """The script looks for who it is in another launcher's variables (mpirun's, srun's), not torchrun's.

    Open MPI's mpirun sets OMPI_COMM_WORLD_RANK, SLURM's srun sets SLURM_PROCID; torchrun sets
    RANK, LOCAL_RANK and WORLD_SIZE. A script that reads only the others finds nothing under
    torchrun: it stops, or (behind a try/except) carries on as a job of one in every process.
    """
    reads = f.job.records("read")
    if any(e["key"] in ("RANK", "LOCAL_RANK") and e["found"] and e["by"] == "script" for _, e in reads):
        return None
    missing = [
        e
        for _, e in f.job.records("read")
        if e["by"] == "script" and not e["found"] and e["key"] not in READ_KEYS
    ]
    if missing:
        e = missing[0]
        what = (
            e["key"].replace("import ", "imports ")
            if e["key"].startswith("import ")
            else f"looks for {e['key']}"
        )
        return Found(
            f"{f.code(e['at'])} {what}, which another launcher provides (mpirun, srun) and torchrun does "
            "not: the script never read torchrun's RANK or LOCAL_RANK",
            explains=("crash",),
        )
    return None


@rule(
    "DDP808",
    "FAIL",
    launch="root",
    help="read who each process is from torchrun: dist.init_process_group() reads RANK and WORLD_SIZE, "
    "and LOCAL_RANK picks the GPU",
)
def never_asks_who_it_is(f):
    """No process asked torchrun who it is: N copies of the same job, each unaware of the others.

    torchrun starts N processes and tells each its RANK, LOCAL_RANK and WORLD_SIZE. A script that
    reads none of them, and makes no process group (which would read them), runs the whole job
    in every process: N times the work, N checkpoints written over each other. Read them, or let
    init_process_group() read them.
    """
    job = f.job
    if len(job.ranks) < 2 or job.records("init") or not job.records("step") or job.records("spawn"):
        return None
    if any(e["key"] in ("RANK", "LOCAL_RANK", "WORLD_SIZE") and e["found"] for _, e in job.records("read")):
        return None
    numbered = f.source.identifiers(r"rank|world_size|num_replicas|nodes?$")
    if not numbered:  # no notion of processes at all: a script not converted yet, DDP step 1's (DDP104)
        return None
    return Found(
        f"none of the {len(job.ranks)} processes read RANK, LOCAL_RANK or WORLD_SIZE, nor made a process "
        f"group: each ran the whole job as if alone, numbered by the script's own {', '.join(numbered[:3])}"
    )


@rule(
    "DDP806",
    "FAIL",
    explains=("hang",),
    help="find what the waiting rank waits for (the line above); the job's output may say more",
)
def hung_before_the_group(f):
    """The job stopped making progress before any rank made its process group.

    No rank reached init_process_group(): the script waits for something before it (a file, a
    lock, a process of its own, input on the terminal), and the check stopped it after --silence
    seconds. A job the check had to stop is never a pass. The report says where each rank was.
    """
    job = f.job
    if not job.hung or job.records("init") or "hang" in f.explained:
        return None
    return Found(
        f"the job stopped making progress ({job.silence:g} s without any) before any rank called "
        f"init_process_group(): {where_each_waits(f)}"
    )


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
    if f.job.records("env"):
        return (
            "ok",
            f"torchrun ran it, {len(f.job.ranks)} processes, but the script overrides what it set (step 1)",
        )
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
    synced = max(e["synced"] if e["prepared"] is None else e["prepared"] for e in steps)
    if synced > 1:
        return Found(
            f"{k} backward passes make each optimizer step, and {synced} of them all-reduce their gradients",
            help=f"wrap the first {k - 1} in model.no_sync(): the gradients then add up locally, and only "
            "the last backward all-reduces them",
        )
    return None


@rule(
    "DDP902",
    "FAIL",
    see="no_sync",
    help="use `with model.no_sync():` around the micro-batches that must not all-reduce (forward and "
    "backward inside it); DDP reads require_backward_grad_sync at forward time, so setting it after the "
    "forward is too late",
)
def steps_on_gradients_never_all_reduced(f):
    """Optimizer steps took gradients that no backward all-reduced: the replicas drift apart.

    DDP decides at each forward, from require_backward_grad_sync, whether the backward that follows
    all-reduces the gradients; the last backward before an optimizer step must, as its all-reduce
    carries every micro-batch's gradients, accumulated. When the last forward of a step had the
    flag off (set False for good, or set True only after the forward: a private flag set too late),
    every rank steps on gradients of its own and the replicas differ. Use model.no_sync() around the
    micro-batches that accumulate, and let the last forward and backward run outside it.
    """
    steps = [e for _, e in f.job.records("step") if e["last"] is False and e["forward"] and e["backward"]]
    if not steps or not f.job.records("ddp"):
        return None
    total = len([e for _, e in f.job.records("step") if e["forward"] and e["backward"]])
    sets = f.source.assignments("require_backward_grad_sync")
    where_set = f" (it is set at {', '.join(f.code(at) for at in sets[:2])})" if sets else ""
    differ = f" The replicas differ at the end: {f.weights_differ}." if f.weights_differ else ""
    return Found(
        f"{len(steps)} of {total} optimizer steps took gradients that no backward all-reduced: the last DDP "
        "forward "
        f"of those steps had require_backward_grad_sync off{where_set}.{differ}",
        follows={4: f"the replicas differ because {len(steps)} optimizer steps were never all-reduced"}
        if f.weights_differ
        else None,
    )


@summary(9)
def step_9_summary(f):
    steps = accumulating(f)
    if not steps:
        return None  # no accumulation: no line
    k = max(e["backward"] for e in steps)
    return "ok", f"{k} micro-batches an optimizer step; only the last backward all-reduces (no_sync)"


# DDP step 10: evaluate exactly


@rule(
    "DDP1007",
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
    return out_of_step(f, "early_stop")


@rule(
    "DDP1001",
    "FAIL",
    explains=("crash", "hang"),
    help="evaluate the bare model, model.module, under torch.no_grad(), where some ranks evaluate alone; "
    "or evaluate through DDP on every rank",
)
def evaluated_through_ddp_alone(f):
    """A rank evaluated through the DDP model while the others did not: DDP's forward waits for them.

    DDP's forward() takes part in collectives (it syncs buffers such as BatchNorm's running
    statistics from rank 0, on every call). Evaluating through it on rank 0 alone (a last
    evaluation, a sample for the log) leaves rank 0 waiting for ranks that are not there: on nccl
    a hang until the timeout, on gloo "Connection closed by peer" once the others have ended. What
    it keeps from happening (the checkpoint after it, the clean-up) follows from it. Evaluate the
    bare model, model.module, or evaluate through DDP on every rank.
    """
    sharded = sharded_evaluation_apart(f)
    found = out_of_step(f, "eval_alone")  # the ranks out of step, or a hang
    if found is None and sharded:  # a sharded model's forward all-gathers: the collectives part, in time
        found = Found(sharded[0].upper() + sharded[1:], explains=())
    if found is not None:
        found.follows = {6: "", 7: ""}
        if sharded:
            found.see, found.help = (
                "fsdp_eval_alone",
                (
                    "evaluate on every rank, each its share of the held-out set, then all-reduce (sum, "
                    "count): a sharded model's forward is a collective"
                ),
            )
        return found
    if not f.crash:
        return None
    rank, e = f.crash
    if (
        e.get("call") != DDP_FORWARD
        or not COMMUNICATION_ERROR.search(e["message"])
        or not evaluating(f, rank)
    ):
        return None
    here = len([x for _, x in f.job.records("eval", rank=rank) if x["at"] == e["at"]])
    others = [
        r
        for r in f.job.ranks
        if r != rank and len([x for _, x in f.job.records("eval", rank=r) if x["at"] == e["at"]]) < here
    ]
    if not others:
        return None
    return Found(
        f"rank {rank} evaluated through the DDP model at {f.code(e['at'])}, and {ranks_text(others)} did "
        f"not: DDP's forward waits for them ({short(e['message'])})",
        follows={6: "", 7: ""},
    )


def sharded_evaluation_apart(f):
    """Where ranks evaluated through a sharded model a different number of times at a line: the text
    saying so, or None. Each such forward all-gathers the parameters, with every rank."""
    counts = collections.defaultdict(collections.Counter)
    for r, e in f.job.records("eval"):
        if e["through"] == "sharded":
            counts[e["at"]][r] += 1
    for at, by in sorted(counts.items()):
        runs = {r: by.get(r, 0) for r in f.job.ranks}
        if len(set(runs.values())) > 1:
            said = ", ".join(f"rank {r} {plural(n, 'time')}" for r, n in sorted(runs.items()))
            return (
                f"the ranks evaluated through the sharded model at {f.code(at)} apart ({said}): each such "
                "forward all-gathers the parameters with every rank, and the ranks' collectives part there"
            )
    return None


def evaluating(f, rank):
    """Whether the rank was evaluating when it stopped: a forward without gradients, or a pass over an
    evaluation loader, came after its last optimizer step and its last pass over training data."""
    for e in reversed(f.job.ranks.get(rank, [])):
        if e["e"] == "eval":
            return True
        if e["e"] == "pass":
            return e["loader"] in f.evaluation
        if e["e"] == "step":
            return False
    return False


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
            f"rank {alone[0]} alone evaluated ({through_ddp[alone[0]]} forwards without gradients, none on "
            "the other ranks): its held-out number is an estimate from its own batches, not the held-out set"
        )
    return None


@rule(
    "DDP1008",
    "FAIL",
    help="give each rank its own part of the held-out data, chosen by its global rank (dist.get_rank(), not "
    "LOCAL_RANK), or seed each rank's generator by it; then all-reduce (sum, count)",
)
def evaluated_alike_then_combined(f):
    """Every rank evaluated the very same batches, and the ranks then combined what they had.

    A collective after an evaluation (all_reduce, all_gather) combines the ranks' parts. Here the
    parts are one and the same: each sample is counted N times, and whatever the other ranks were
    meant to evaluate never was. Ranks on different nodes choose alike when the choice comes from
    LOCAL_RANK (the same on every node), or from a generator seeded alike. Choose by the global
    rank.
    """
    by_hand = f.evaluated_by_hand
    if by_hand and by_hand[1] and f.evaluated_alike:
        return Found(
            f"every rank evaluated the very same batches (from {f.code(by_hand[0])}), and the ranks then "
            "combined them: each counted as many times as there are ranks, and the parts meant for the "
            "others never evaluated"
        )
    return None


@rule(
    "DDP1005",
    "warn",
    help="give each rank its shard of the held-out set (rank r: samples r, r + N, ...), and all-reduce "
    "(sum, count): the same number, N times faster",
)
def every_rank_evaluates_everything(f):
    """Every rank evaluated the whole held-out set: exact, and N times the work for nothing.

    The number is right, but each of the N processes computes it all: the evaluation takes as
    long as on one process, and N - 1 of them throw their result away. Give each rank its shard
    and all-reduce the sums.
    """
    if not crashed_in_evaluation(f) and f.evaluated and f.evaluated[0] == "all":
        _, _, at, union, _ = f.evaluated
        return Found(
            f"every rank evaluated all {union} held-out samples (DataLoader at {f.code(at)}): exact, and "
            f"{f.world} times the work"
        )
    if f.evaluated_by_hand and f.evaluated_alike:
        return Found(
            "every rank evaluated the very same batches, without a DataLoader (from "
            f"{f.code(f.evaluated_by_hand[0])}): "
            f"the held-out number is exact on each, and {f.world} times the work"
        )
    return None


@rule(
    "DDP1006",
    "warn",
    see="metrics",
    help="all-reduce the held-out sums (loss x samples, samples) after evaluating, before dividing; or give "
    "each rank its shard of a held-out DataLoader",
)
def evaluation_by_hand_not_reduced(f):
    """Every rank evaluated batches of its own, drawn without a DataLoader, and no collective followed.

    Each rank's held-out loss is a mean over the batches it drew: an estimate, different on
    every rank, and rank 0 reports its own. All-reduce the sums before dividing, so that the
    number is the mean over every rank's batches.
    """
    by_hand = f.evaluated_by_hand
    if by_hand and not by_hand[1] and not f.evaluated_alike:
        return Found(
            f"every rank evaluated batches of its own without a DataLoader (forwards without gradients "
            f"from {f.code(by_hand[0])}), and no collective followed: each rank's held-out number is its "
            "own batches'"
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
    if f.evaluated_by_hand and f.evaluated_by_hand[1]:
        return "ok", (
            f"each rank evaluated without a DataLoader (from {f.evaluated_by_hand[0]}), then all-reduced"
        )
    if crashed_in_evaluation(f) or not f.evaluated:
        return None  # no evaluation; or the script's own error in it, reported as such in this step
    how, i, at, union, _ = f.evaluated
    differ = datasets_differ(f, f.evaluation[i])
    if differ:  # indices counted once each, of sets that are not one: no "each once" to claim
        return "--", f"not checked whether each held-out sample counts once: {differ} (DDP step 3's rule)"
    if how == "all":  # DDP1005's, where the script silences it
        return "ok", f"every rank evaluated all {union} held-out samples: exact (DataLoader at {at})"
    return (
        "ok",
        f"each rank evaluated its own shard, then all-reduced: {union} held-out samples, each once "
        f"(DataLoader at {at})",
    )


# At the end: what no step's line accounts for (AT_THE_END), at the step it names


@rule(
    "DDP000",
    "FAIL",
    explains=("crash",),
    help="the script's own error, not a DDP step's: torchrun then stopped every rank. Its traceback is in "
    "the job's output (below)",
)
def crashed(f):
    """The script stopped with an error of its own.

    A rank raised an error that none of the other findings explains; torchrun then stopped every
    rank. The report puts it where the call that raised it belongs: under its DDP step, where that
    call is a DDP call (a DataLoader made with both a sampler and shuffle=True: DDP step 3; a
    checkpoint that does not load: DDP step 6); else on a line of its own, the script's, where the
    script's own code raised it (a bug of its own, a library's error, a file it cannot find), whatever
    step the job was in. The job's output has the whole traceback. An error that is not the script's
    is not checked (--): one that needs a GPU the stand-in cannot give (CUDA's own generator, a CUDA
    extension), a program the script runs that the machine lacks, or one of check_ddp's own code.
    """
    if f.crash is None or "crash" in f.explained:
        return None
    rank, event = f.crash
    step = crash_step(f, rank, event)
    error = f"{event['type']}: {short(event['message'])}"
    at = inner_place(event["message"], f.job) or event["at"]
    first_unjudged = next((s for s in STEPS if s not in {x.step for x in f.lines if x.verdict != "--"}), 8)
    if event["raised"] == "checker" and rank not in f.refused:  # this file's own error: never the script's
        return Found(
            f"not checked: check_ddp's own error stopped the job here, at {f.code(event['at'])}: {error}",
            step=step or first_unjudged,
            verdict="--",
        )
    if event["program"]:  # a program this machine lacks: the machine's, not the script's
        return Found(
            f"not checked: the job stopped where the script runs {event['program']}, which this machine "
            f"lacks, at {f.code(at)}",
            step=step or first_unjudged,
            verdict="--",
        )
    if f.standin and needs_gpu(f, rank, event):  # what the stand-in cannot run: a step not judged
        judged = {x.step for x in f.lines if x.verdict != "--"}
        step = next((s for s in STEPS if (step or 1) <= s <= 8 and s not in judged), step or first_unjudged)
        return Found(
            f"not checked: the job stopped where it needs a GPU, at {f.code(event['at'])}: {error}",
            step=step,
            verdict="--",
        )
    doing = crash_phase(f, rank)[0]
    return Found(f"rank {rank} stopped with an error {doing}, at {f.code(at)}: {error}", step=step)


@rule(
    "DDP504",
    "FAIL",
    see="rank_zero_collective",
    help="every rank must reach the same collectives, in the same order",
)
def stopped_making_progress(f):
    """The job stopped making progress after its ranks met, for a reason the records do not show.

    The report names where each rank waits. Most often a rank waits in a collective that another
    rank never reaches, or reaches in a different order. A job the check had to stop is never a
    pass: where no other line says why it stopped, this one does, under DDP step 5.
    """
    found = out_of_step(f, None)
    if found is not None:
        found.step = 5
        return found
    if (f.job.hung or f.job.stuck_at_exit) and not any(line.verdict == "FAIL" for line in f.lines):
        return Found(f"the check stopped the job: {where_each_waits(f)}", step=5)
    return None


# -----------------------------------------------------------------------------
# 4. report: a line per step, details only where they help, the verdict last


def from_here(path):
    """A path as the reader types it from where they are: relative below their folder, else whole."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else str(path)


def pitfall_path(key):
    """Where the pitfall program is, beside this file, as the reader finds it from here; None
    where this file was copied alone."""
    path = Path(__file__).resolve().parent / PITFALLS[key]
    return from_here(path) if path.is_file() else None


def explain_command(code=""):
    """The command that explains a finding, as the reader types it from where they are: this file
    may be elsewhere (python ../tools/check_ddp.py my_train.py)."""
    return f"python {from_here(Path(__file__).resolve())} --explain {code}".rstrip()


def see(line):
    """Where to read more about a finding: its pitfall, if it is here, and its explanation."""
    explanation = explain_command(line.code)
    pitfall = pitfall_path(line.see) if line.see else None
    return f"{pitfall}; {explanation}" if pitfall else explanation


def how_it_ran(job):
    """2 processes as 2 nodes of 1, GPU script stood in on the CPU: cuda -> cpu, nccl -> gloo."""
    n = len(job.ranks) or job.nproc
    processes = plural(n, "process")
    if job.nnodes > 1 or job.then is None and job.folder.name == "one_node":
        processes += f" as {plural(job.nnodes, 'node')} of {n // job.nnodes}"
    if job.device == "cuda":
        return f"{processes}, GPUs"
    asked = job.records("gpu") or any("nccl" in e["backend"].lower() for _, e in job.records("init"))
    return f"{processes}, " + (
        "GPU script stood in on the CPU: cuda -> cpu, nccl -> gloo" if asked else "CPU"
    )


def as_json(job, lines, status):
    """The report as data: what ran, and a finding per DDP step (and the script's own error, step null),
    as the text report has them; the findings silenced, and the silencing comments that name no code."""
    findings = [
        {
            "step": line.step or None,
            "name": step_name(line.step),
            "verdict": line.verdict,
            "code": line.code,
            "message": line.message,
            "at": re.findall(r"[\w./-]+\.py:\d+", line.message),
            "help": line.help if line.verdict in ("FAIL", "warn") else None,
            "see": see(line) if line.verdict in ("FAIL", "warn") else None,
        }
        for line in lines
    ]
    return {
        "command": job.command,
        "how": how_it_ran(job),
        "seconds": round(job.seconds, 1),
        "exit": status,
        "findings": findings,
        "ignored": [{"code": code, "at": at, "step": step} for code, at, step in job.ignored],
        "unknown_ignores": [{"at": at, "code": code} for at, code in job.unknown_ignores],
        "own_errors": own_errors(job),
        "output": str(job.folder / "output.log"),
    }


def step_name(step):
    return STEPS.get(step, "the script's own error")


def report(job, lines):
    width = 100
    out = [f"check_ddp: {' '.join(job.command)}  ({how_it_ran(job)}; {job.seconds:.1f} s)"]
    for before, again in itertools.pairwise(runs(job)):
        stops = [line for line in judge_one(before) if stopper(line)]
        what = " and ".join(SET_ASIDE[RULES[line.code].sets_aside] for line in stops)
        steps = ", ".join(str(line.step) for line in stops)
        out.append(
            f"check_ddp: it stopped at DDP step {steps}, so checked again {what} ({how_it_ran(again)}; "
            f"{again.seconds:.1f} s): DDP step {steps} from the run before, the other steps from this one"
        )
    for line in lines:
        name = f"DDP step {line.step:<2}" if line.step else "the script"
        head = f"{name:<11} {line.verdict:<5} "
        indent = " " * len(head)
        out.append(
            textwrap.fill(
                f"{step_name(line.step)}: {line.message}",
                width,
                initial_indent=head,
                subsequent_indent=indent,
            )
        )
        if line.verdict in ("FAIL", "warn"):
            out.append(
                textwrap.fill(
                    line.help, width, initial_indent=indent + "help: ", subsequent_indent=indent + " " * 6
                )
            )
            out.append(f"{indent}see:  {see(line)}")  # whole, to copy
    out += [
        f"check_ddp: {at}: ignore[{code}] names no code of check_ddp's ({explain_command()} lists them)"
        for at, code in job.unknown_ignores
    ]
    own = own_errors(job)
    out += [f"check_ddp: {text}" for text in own]
    failed = [line.step for line in lines if line.verdict == "FAIL" and line.step]
    warned = [line.step for line in lines if line.verdict == "warn"]
    verdict = (
        "FAIL: DDP step " + ", ".join(map(str, failed)) + " failed" if failed else "ok: no DDP step failed"
    )
    if any(line.verdict == "FAIL" and not line.step for line in lines):
        verdict = (verdict + ", and" if failed else "FAIL:") + " the script stopped with its own error"
    if warned:
        verdict += f" ({plural(len(warned), 'warning')}: DDP step " + ", ".join(map(str, warned)) + ")"
    if job.ignored:
        verdict += f"; {plural(len(job.ignored), 'finding')} ignored as the script asks: " + ", ".join(
            f"{code} at {at}" for code, at, _ in job.ignored
        )
    if own:
        verdict += "; the check is incomplete: check_ddp's own error, above, is not your script's"
    if any(line.verdict == "--" for line in lines):
        verdict += ". --: not checked (the job did not show it, or it follows from another step)"
    out.append(f"check_ddp: {verdict}. The job's own output: {job.folder / 'output.log'}")
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main())
