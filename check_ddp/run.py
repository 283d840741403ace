"""1. run: torchrun, with a watcher in each of its processes (sitecustomize loads check_ddp.watch), and a
job that makes no progress stopped. All the job leaves is in its folder (check_ddp.job)."""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .job import Job


def visible_gpus(options):
    """The GPUs the job's processes will see. CUDA_VISIBLE_DEVICES="" hides them all: then torch,
    seconds to import, is not needed to know it."""
    if options.cpu or os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return 0
    import torch

    return torch.cuda.device_count()


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
    env = dict(os.environ, CHECK_DDP_FOLDER=str(folder), CHECK_DDP_TOOL=str(PACKAGE))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
    env["CHECK_DDP_NNODES"] = str(nnodes)
    if "launch" in aside:  # the script's own launch variables and init arguments set aside: torchrun's kept
        env["CHECK_DDP_KEEP_LAUNCH"] = "1"
    if "launcher" in aside:  # the job as the launcher the script was written for makes it: a port of its own
        env.update(CHECK_DDP_AS_LAUNCHER="1", CHECK_DDP_LAUNCHER_PORT=str(free_port()))
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


def free_port():
    """A port no one listens on now: where a job made as its own launcher makes it meets (as a batch
    file exports MASTER_PORT for srun or mpirun), apart from torchrun's store."""
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


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


PACKAGE = Path(__file__).resolve().parent  # check_ddp's own folder, which each worker loads


# What each process of the job runs before its script: Python imports sitecustomize at start-up
# from the path. It watches only torchrun's workers (not torchrun itself, nor processes they
# start), then hands over to any sitecustomize this one hides. The package is loaded under a
# name of its own, from its folder, so that nothing of it is on the script's import path.
SITECUSTOMIZE = """
import importlib, importlib.machinery, importlib.util, os, sys
if "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ and "CHECK_DDP_WATCHED" not in os.environ:
    os.environ["CHECK_DDP_WATCHED"] = str(os.getpid())
    _tool = os.environ["CHECK_DDP_TOOL"]
    _spec = importlib.util.spec_from_file_location(
        "_check_ddp", os.path.join(_tool, "__init__.py"), submodule_search_locations=[_tool]
    )
    sys.modules["_check_ddp"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["_check_ddp"])
    importlib.import_module("_check_ddp.worker").watch()
_here = os.path.dirname(os.path.abspath(__file__))
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [p for p in sys.path if p != _here])
if _spec is not None:
    _module = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_module)
"""
