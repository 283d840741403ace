"""What this machine runs the project on: Python, torch and its CUDA, NCCL, the GPUs, the
packages the tests need, nvidia-smi. benchmarks/gpu_checks.sh writes it to $OUT before
anything else, so that every figure after it says where it came from.

    python benchmarks/environment.py

It reports what it finds and fails for nothing it lacks: a torch that cannot be imported,
no GPU, no nvidia-smi are each a line of the report. benchmark.py puts describe() in its JSON.

Kept is how a benchmark keeps its output for the pages that quote it (--keep FILE): what it
printed, what it measured, when, on what machine and under what load, in one small JSON file
beside it; tests/test_figures.py reads each page's figures from those files.
"""

import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# what the scripts, the tests and the notebook import
PACKAGES = ("torch", "numpy", "filelock", "pytest", "matplotlib", "nbformat", "nbclient")


def package(name):
    """Its version, or "missing" where it cannot be imported (found without importing it)."""
    try:
        if importlib.util.find_spec(name) is None:
            return "missing"
    except ImportError:
        return "missing"
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "present, version unknown"


def cpu():
    """The CPU's model, as the kernel names it (/proc/cpuinfo), or as Python does elsewhere."""
    try:
        found = re.search(r"^model name\s*: (.+)$", Path("/proc/cpuinfo").read_text(), flags=re.M)
    except OSError:
        found = None
    return found.group(1).strip() if found else platform.processor() or "unknown"


def describe():
    """The facts, each a short string."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    facts = {
        "python": f"{platform.python_version()} ({sys.executable})",
        "platform": f"{platform.platform()}, {os.cpu_count()} CPU cores",
        "cpu": cpu(),
        "packages": ", ".join(f"{name} {package(name)}" for name in PACKAGES),
        "commit": git("rev-parse", "--short", "HEAD") or "unknown (not a git checkout)",
        "CUDA_VISIBLE_DEVICES": "(not set)" if visible is None else repr(visible),
    }
    try:
        import torch
    except ImportError as error:
        facts["torch"] = f"cannot be imported: {error}"
        return facts
    facts["torch"] = torch.__version__
    facts["cuda"] = (
        f"{torch.version.cuda} (torch's build)" if torch.version.cuda else "none: a CPU build of torch"
    )
    nccl = torch.distributed.is_available() and torch.distributed.is_nccl_available()
    facts["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if nccl else "not in this build"
    # the twins train in float32; "highest" keeps their matmuls in full float32 (no TF32)
    facts["float32 matmul precision"] = torch.get_float32_matmul_precision()
    count = torch.cuda.device_count()
    facts["gpus"] = str(count)
    for i in range(count):
        gpu = torch.cuda.get_device_properties(i)
        facts[f"gpu {i}"] = (
            f"{gpu.name}, {gpu.total_memory / 2**30:.0f} GiB, compute capability {gpu.major}.{gpu.minor}, "
            f"{gpu.multi_processor_count} multiprocessors"
        )
    return facts


class Kept:
    """A benchmark's output, printed and kept: say() prints a line and keeps it; save() adds a last
    line, when and where it ran and under what load, and writes everything to the --keep file (if
    one was given) as JSON: the command, the machine, the load, the printed lines, and what the
    benchmark measured."""

    def __init__(self, path):
        self.path, self.lines = path, []
        self.script = os.path.relpath(os.path.abspath(sys.argv[0]), ROOT)  # as run, before any chdir
        self.load = {"start": round(os.getloadavg()[0], 2), "cores": os.cpu_count()}  # the 1-minute average

    def say(self, text=""):
        print(text, flush=True)
        self.lines.extend(str(text).split("\n"))

    def save(self, machine, **measured):
        """machine: in words, as the benchmark names it (a 2-core x86_64 CPU, gloo; 2 x H200, nccl)."""
        if not self.path:
            return
        self.load["end"] = round(os.getloadavg()[0], 2)
        date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
        self.say(
            f"kept in {os.path.relpath(os.path.abspath(self.path), ROOT)}: {date}; {machine} ({cpu()}); "
            f"load average {self.load['start']:.1f} at the start, {self.load['end']:.1f} at the end"
        )
        record = {
            "date": date,
            "command": " ".join(["python", self.script, *sys.argv[1:]]),
            "machine": machine,
            "environment": describe(),
            "load_average": self.load,
            "printed": "\n".join(self.lines) + "\n",
            **measured,
        }
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        Path(self.path).write_text(json.dumps(record, indent=2) + "\n")


def git(*args):
    try:
        proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def nvidia_smi(*args):
    if not shutil.which("nvidia-smi"):
        return "nvidia-smi: not found"
    try:
        proc = subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "nvidia-smi: no answer within 30 s"
    return (proc.stdout + proc.stderr).rstrip()


if __name__ == "__main__":
    for name, value in describe().items():
        print(f"{name}: {value}")
    print(f"\n$ nvidia-smi\n{nvidia_smi()}")
    print(f"\n$ nvidia-smi topo -m  # how the GPUs are linked\n{nvidia_smi('topo', '-m')}")
