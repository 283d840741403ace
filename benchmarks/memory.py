"""What FSDP2 saves, measured: each rank's parameters, gradients and optimizer state, and the step time,
for the baseline, DDP and FSDP2 at N = 1, 2, 4 processes.

    python benchmarks/memory.py                          # about 5 minutes on 2 CPU cores
    python benchmarks/memory.py --hidden_size 2048 --repeats 5
    python benchmarks/memory.py --keep benchmarks/memory.kept.json   # docs/fsdp.md's figures

Each case is the script a user runs, unchanged (`python single_gpu_baseline.py`, `torchrun ...
train_ddp.py`, `torchrun ... train_fsdp.py`), under benchmarks/state_bytes.py, which counts the
tensors the optimizer holds on each rank at its first step: a DTensor, FSDP2's shard, by the part
the rank stores. The model is the scripts' own, wide (--hidden_size 1024: its middle layer holds
nearly all of its weights, and splits into N shards of equal rows), so that the shards matter;
each process keeps the batch (64), so that every N does the same work a process. The step time is
the scripts' own clock (metrics.jsonl: an epoch's seconds over its optimizer steps), the median of
the epochs after the first. Rounds run every case once, in an order rotated from round to round;
the bytes are the same in every round (a run that says otherwise stops the benchmark), the times
are reported as the median with min and max. Every process gets one thread (OMP_NUM_THREADS=1), as
in benchmark.py. --keep writes what it printed, with the date, the machine and its load, to a
small JSON file, from which tests/test_figures.py reads the pages' figures. No test asserts a
number.
"""

import argparse
import json
import math
import os
import platform
import re
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from environment import Kept  # benchmarks/environment.py

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = {"baseline": "single_gpu_baseline.py", "DDP": "train_ddp.py", "FSDP2": "train_fsdp.py"}

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--hidden_size", type=int, default=1024, help="the model's width (default: 1024)")
parser.add_argument("--nprocs", default="1,2,4", help="process counts (default: %(default)s)")
parser.add_argument("--repeats", type=int, default=3, help="rounds of every case (default: 3)")
parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="(default: auto)")
parser.add_argument("--run_timeout", type=float, default=300, help="seconds a run may take (default: 300)")
parser.add_argument(
    "--keep", metavar="FILE", help="also write what it printed, date, machine and load to FILE (JSON)"
)
args = parser.parse_args()
kept = Kept(args.keep and os.path.abspath(args.keep))
cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
if cuda and not torch.cuda.is_available():
    parser.error("--device cuda: PyTorch sees no CUDA GPU on this machine; use --device cpu")
nprocs = [int(n) for n in args.nprocs.split(",")]
if cuda and max(nprocs) > torch.cuda.device_count():
    parser.error(
        f"--nprocs {args.nprocs}: this machine has {torch.cuda.device_count()} GPU(s), one per process"
    )
BATCH, DATASET, EPOCHS = 64, 4096, 3
flags = ["--hidden_size", str(args.hidden_size), "--batch_size", str(BATCH), "--dataset_size", str(DATASET)]
flags += ["--epochs", str(EPOCHS), "--save_interval", str(EPOCHS), "--device", "cuda" if cuda else "cpu"]
cases = [("baseline", 1)] + [(script, n) for script in ("DDP", "FSDP2") for n in nprocs]
machine = (
    f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}, nccl"
    if cuda
    else f"{os.cpu_count()}-core {platform.machine()} CPU, gloo"
)
env = dict(os.environ, OMP_NUM_THREADS="1")
scratch = Path(tempfile.mkdtemp(prefix="memory-"))
os.chdir(ROOT)  # the runs are the project's commands, run from its folder


def run(script, n, folder):
    """One run of a case: what each rank held, and the step time in ms."""
    launcher = [sys.executable]
    if script != "baseline":
        launcher += ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]
    command = [*launcher, "benchmarks/state_bytes.py", SCRIPTS[script], *flags, "--out_dir", str(folder)]
    try:
        proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=args.run_timeout)
    except subprocess.TimeoutExpired:
        sys.exit(f"memory: {script} at N={n} ran past --run_timeout {args.run_timeout:g} s")
    if proc.returncode:
        sys.exit(f"memory: {script} at N={n} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    ranks = sorted(
        (json.loads(line) for line in re.findall(r"^STATE_BYTES (.*)$", proc.stderr, flags=re.M)),
        key=lambda rank: rank["rank"],
    )
    if [rank["rank"] for rank in ranks] != list(range(n)):
        sys.exit(f"memory: {script} at N={n}: not every rank reported\n{proc.stderr[-3000:]}")
    epochs = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    steps = math.ceil(math.ceil(DATASET / n) / BATCH)  # optimizer steps an epoch, on each rank
    step_ms = statistics.median(1000 * epoch["seconds"] / steps for epoch in epochs[1:])
    shutil.rmtree(folder)
    return [{key: rank[key] for key in ("params", "grads", "state")} for rank in ranks], step_ms


measured = {f"{script} N={n}": {"script": script, "nproc": n, "step_ms": []} for script, n in cases}
for k in range(args.repeats):
    order = cases[k % len(cases) :] + cases[: k % len(cases)]  # rotated, so that no case always goes first
    for script, n in order:
        case = measured[f"{script} N={n}"]
        ranks, step_ms = run(script, n, scratch / f"{script}-{n}-{k}")
        if case.setdefault("ranks", ranks) != ranks:
            sys.exit(
                f"memory: {script} at N={n} held other bytes in round {k + 1}: {ranks}, not {case['ranks']}"
            )
        case["step_ms"].append(step_ms)
    print(f"round {k + 1}/{args.repeats} done", file=sys.stderr, flush=True)
shutil.rmtree(scratch, ignore_errors=True)


def mib(size):
    return f"{size / 2**20:.2f}"


def largest(case):
    """The rank that holds the most (FSDP2's last layer has one row: one rank holds all of it)."""
    return max(case["ranks"], key=lambda rank: sum(rank.values()))


def summary(values):
    text = f"{statistics.median(values):.1f}"
    return text if len(values) == 1 else f"{text} ({min(values):.1f} to {max(values):.1f})"


model = runpy.run_path("single_gpu_baseline.py")["make_model"](
    argparse.Namespace(hidden_size=args.hidden_size)
)
parameters = sum(p.numel() for p in model.parameters())
rounds = f"{args.repeats} rounds; step ms: median (min to max)" if args.repeats > 1 else "1 round"
label = (
    f"--hidden_size {args.hidden_size} ({parameters:,} parameters), batch {BATCH} a process; {machine}; "
    f"torch {torch.__version__}"
)
kept.say(f"{label}; {rounds}")
kept.say("MiB a rank, the rank that holds the most: SGD's momentum is the optimizer state\n")
kept.say(
    "| script | N | parameters | gradients | optimizer state | total | / DDP's | step ms |\n"
    "| --- | --- | --- | --- | --- | --- | --- | --- |"
)
ratios = {}
for script, n in cases:
    case = measured[f"{script} N={n}"]
    held = largest(case)
    total = sum(held.values())
    ddp = measured.get(f"DDP N={n}")
    ratio = total / sum(largest(ddp).values()) if ddp and script == "FSDP2" else None
    if ratio is not None:
        ratios[n] = ratio
    kept.say(
        f"| {script} | {n} | {mib(held['params'])} | {mib(held['grads'])} | {mib(held['state'])} | "
        f"{mib(total)} | {f'{ratio:.2f}x' if ratio is not None else ''} | {summary(case['step_ms'])} |"
    )
if ratios:
    kept.say(
        "\nFSDP2's parameters, gradients and optimizer state a rank, against DDP's: "
        + ", ".join(f"{ratio:.2f}x at N={n}" for n, ratio in ratios.items())
    )
kept.save(machine, label=label, cases=list(measured.values()))
