"""Measure the twin scripts side by side: DDP overhead, scaling and what limits it, time to first result.

    python benchmarks/benchmark.py                        # about 4 minutes on 2 CPU cores
    python benchmarks/benchmark.py --nprocs 1,2,4 --repeats 5 --json out/benchmark.json
    python benchmarks/benchmark.py --device cpu           # the CPU (gloo) even on a GPU machine

Each round runs every case once, in a rotated order, and the benchmark repeats rounds
(--repeats, at least 3): these machines are noisy, so numbers measured side by side,
in the same round, are compared, and medians with min and max are reported. It prints
two tables and what they say, and writes them as JSON. Throughput comes from the
scripts' own metrics.jsonl (the loop's clock, start-up excluded): the median epoch
after the first.

Every run gets OMP_NUM_THREADS=1: torchrun sets it when it starts several processes
but not for one, which would let 1 process use every core and make any scaling look
flat. With it, N processes use N cores. On GPUs each process has a GPU of its own, so
no N exceeds the GPUs, and the 2-process cases run 1 process on a 1-GPU machine. A
run that fails is run again once, after its reason (its last lines of stderr) is
printed; a second failure stops the benchmark.

Where scaling goes is measured, not guessed: the largest N is run a second time with
DDP's gradient all-reduce skipped (benchmarks/no_comm.py, torch's noop_hook), in the
same rounds, and the difference is the share of a step the all-reduce takes.
"""

import argparse
import itertools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
REGIMES = {  # the scaling presets: flags for train_ddp.py, per process
    "small": ["--hidden_size", "64", "--batch_size", "64", "--dataset_size", "16384"],
    "wide": ["--hidden_size", "512", "--batch_size", "1024", "--dataset_size", "32768"],
}

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--repeats", type=int, default=3, help="rounds of every case, at least 3 (default: 3)")
parser.add_argument(
    "--nprocs",
    help="process counts for scaling, e.g. 1,2,4 (default: 1, 2, 4, those that fit the GPUs, else the cores)",
)
parser.add_argument(
    "--device",
    choices=["auto", "cuda", "cpu"],
    default="auto",
    help="auto: the GPUs (nccl) if there are any, else the CPU (gloo) (default: auto)",
)
parser.add_argument(
    "--json", default="out/benchmark.json", help="where the results go (default: %(default)s)"
)
args = parser.parse_args()
use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
if use_cuda and not torch.cuda.is_available():
    parser.error("--device cuda: PyTorch sees no CUDA GPU on this machine; use --device cpu")
if args.repeats < 3:
    parser.error("--repeats must be at least 3: one run of a noisy machine measures nothing")
slots = torch.cuda.device_count() if use_cuda else os.cpu_count()
nprocs = [int(n) for n in args.nprocs.split(",")] if args.nprocs else [n for n in (1, 2, 4) if n <= slots]
if nprocs[0] != 1:
    parser.error("--nprocs must start with 1: efficiency is measured against one process")
if use_cuda and max(nprocs) > slots:
    parser.error(f"--nprocs {args.nprocs}: this machine has {slots} GPU(s), one per process")
pair = min(2, slots)  # the README's command runs 2 processes; a 1-GPU machine runs 1
widest = nprocs[-1] if len(nprocs) > 1 else None  # where the all-reduce is measured
device_flags = ["--device", "cuda" if use_cuda else "cpu"]

env = dict(os.environ, OMP_NUM_THREADS="1")
scratch = Path(tempfile.mkdtemp(prefix="benchmark-"))
run_ids = itertools.count()
retried = []  # the runs that failed once


# -----------------------------------------------------------------------------
# how a case runs: the command a user would type, timed by the script or by the clock


def launch(script, flags, nproc, wrapper=None):
    """python for the baseline, torchrun for the rest; a wrapper runs the script inside it."""
    if nproc is None:
        return [sys.executable, script, *flags]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    return [*torchrun, *([wrapper] if wrapper else []), script, *flags]


def reason(stderr):
    """The last lines a failed run wrote, less torchrun's own report of the failure, which
    follows them and names only exit codes."""
    lines = [line for line in stderr.splitlines() if not re.match(r"[WIE]\d{4} .*torch/distributed", line)]
    tracebacks = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if tracebacks and any("ChildFailedError" in line for line in lines[tracebacks[-1] :]):
        lines = lines[: tracebacks[-1]]
    return "\n".join(lines[-20:])


def run(command_for):
    """Run one case in a fresh folder; return the folder and the run's wall time. A run
    that fails is run again once, after its reason is printed; a second failure stops
    the benchmark with the reason."""
    for attempt in (1, 2):
        out = scratch / f"run{next(run_ids)}"
        command = command_for(out)
        start = time.perf_counter()
        proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if proc.returncode == 0:
            return out, seconds
        failure = f"a run failed (exit {proc.returncode}):\n  {' '.join(command)}\n{reason(proc.stderr)}"
        if attempt == 1:
            print(f"benchmark: {failure}\nbenchmark: running it again", file=sys.stderr, flush=True)
            retried.append(" ".join(command))
    shutil.rmtree(scratch)
    sys.exit(f"benchmark: twice {failure}")


def throughput(script, flags, nproc=None, wrapper=None):
    out, _ = run(
        lambda out: launch(
            script, [*flags, *device_flags, "--epochs", "4", "--out_dir", str(out)], nproc, wrapper
        )
    )
    epochs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["samples_per_sec"] for r in epochs[1:])


def wall_time(script):
    """The whole job, start-up included, as a user waits for it."""

    def command(out):
        out_flags = ["--out_dir", str(out)] if script == "train_ddp.py" else []
        return launch(script, [*device_flags, *out_flags], pair)

    return run(command)[1]


# -----------------------------------------------------------------------------
# the cases, each a function that returns one number

cases = {
    "first result": lambda: wall_time("train_ddp.py"),  # the README's command, its defaults
    "floor": lambda: wall_time("benchmarks/floor.py"),
}
for regime, flags in REGIMES.items():
    cases[f"{regime} baseline"] = lambda flags=flags: throughput("single_gpu_baseline.py", flags)
    for n in nprocs:
        cases[f"{regime} N={n}"] = lambda flags=flags, n=n: throughput("train_ddp.py", flags, n)
    if widest:  # the same run, with the gradient all-reduce skipped
        cases[f"{regime} N={widest} no all-reduce"] = lambda flags=flags: throughput(
            "train_ddp.py", flags, widest, wrapper="benchmarks/no_comm.py"
        )
accumulating = nprocs[1] if len(nprocs) > 1 else None  # step 9's effect, where gradients are exchanged
if accumulating:
    accum_flags = [*REGIMES["small"], "--grad_accum_steps", "4"]
    cases[f"small N={accumulating} K=4"] = lambda: throughput("train_ddp.py", accum_flags, accumulating)

load = {"start": os.getloadavg()[0]}  # the 1-minute load average: other work skews every number
rounds = []
for r in range(args.repeats):
    names = list(cases)
    names = names[r % len(names) :] + names[: r % len(names)]  # rotate, so no case always goes first
    rounds.append({name: cases[name]() for name in names})
    print(f"round {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
shutil.rmtree(scratch)
load["end"] = os.getloadavg()[0]

# -----------------------------------------------------------------------------
# what the rounds say: ratios within each round, then their median, min and max


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


results = {name: summary([one[name] for one in rounds]) for name in cases}
derived = {"first_result_gap_s": summary([one["first result"] - one["floor"] for one in rounds])}
meaning = {"first_result_gap_s": "first result - floor: the job's own start-up and training"}
for regime in REGIMES:
    derived[f"ddp_overhead_{regime}"] = summary(
        [one[f"{regime} N=1"] / one[f"{regime} baseline"] for one in rounds]
    )
    meaning[f"ddp_overhead_{regime}"] = "N=1 / baseline: what DDP costs with nothing to share"
for regime in REGIMES:
    for n in nprocs[1:]:
        derived[f"{regime}_efficiency_n{n}"] = summary(
            [one[f"{regime} N={n}"] / (n * one[f"{regime} N=1"]) for one in rounds]
        )
        meaning[f"{regime}_efficiency_n{n}"] = f"N={n} / ({n} x N=1): 1 is perfect scaling"
    if widest:
        without = f"{regime} N={widest} no all-reduce"
        derived[f"{regime}_efficiency_n{widest}_no_allreduce"] = summary(
            [one[without] / (widest * one[f"{regime} N=1"]) for one in rounds]
        )
        meaning[f"{regime}_efficiency_n{widest}_no_allreduce"] = "the same, with the all-reduce skipped"
        # time per sample with it, less time per sample without it, over time per sample with it
        derived[f"{regime}_allreduce_share_n{widest}"] = summary(
            [1 - one[f"{regime} N={widest}"] / one[without] for one in rounds]
        )
        meaning[f"{regime}_allreduce_share_n{widest}"] = "1 - with / without: the share of a step it takes"
if accumulating:  # --grad_accum_steps 4 against 1: a quarter of the all-reduces, the same samples
    derived[f"small_accum_k4_speedup_n{accumulating}"] = summary(
        [one[f"small N={accumulating} K=4"] / one[f"small N={accumulating}"] for one in rounds]
    )
    meaning[f"small_accum_k4_speedup_n{accumulating}"] = "K=4 / K=1: a quarter of the all-reduces"

explained = []  # where the scaling goes, in a sentence per regime, with the numbers of one round
for regime in REGIMES if widest else ():
    with_, without, one_process = (
        f"{regime} N={widest}",
        f"{regime} N={widest} no all-reduce",
        f"{regime} N=1",
    )
    shares = sorted((1 - one[with_] / one[without], i) for i, one in enumerate(rounds))
    share, i = shares[(len(shares) - 1) // 2]  # the median round, so that its numbers add up
    one = rounds[i]
    explained.append(
        f"{regime} N={widest}: {one[with_] / 1000:,.0f}k samples/s with the all-reduce, "
        f"{one[without] / 1000:,.0f}k without it (the median round): the all-reduce takes {share:.0%} "
        f"of a step ({shares[0][0]:.0%} to {shares[-1][0]:.0%} across rounds). Against "
        f"{one[one_process] / 1000:,.0f}k at N=1, scaling efficiency is "
        f"{one[with_] / (widest * one[one_process]):.2f} with it and "
        f"{one[without] / (widest * one[one_process]):.2f} without it."
    )

# -----------------------------------------------------------------------------
# report

if use_cuda:
    machine = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}, nccl"
else:
    machine = f"{os.cpu_count()}-core {platform.machine()} CPU, gloo"
report = {
    "machine": machine,
    "torch": torch.__version__,
    "python": platform.python_version(),
    "command": " ".join(["python", "benchmarks/benchmark.py", *sys.argv[1:]]),
    "repeats": args.repeats,
    "load_average": load,
    "rounds": rounds,  # every number measured, round by round
    "measured": results,
    "derived": derived,
    "meaning": meaning,
    "explained": explained,
    "retried": retried,
}
Path(args.json).parent.mkdir(parents=True, exist_ok=True)
Path(args.json).write_text(json.dumps(report, indent=2) + "\n")

print(f"{machine}; torch {torch.__version__}; {args.repeats} rounds; median, min and max")
print(
    f"load average {load['start']:.1f} at the start, {load['end']:.1f} at the end ({os.cpu_count()} cores)\n"
)
print("| measurement | median | min | max | unit |")
print("| --- | --- | --- | --- | --- |")
for name, stats in results.items():
    unit = f"s (wall, whole job, N={pair})" if name in ("first result", "floor") else "samples/s"
    print(f"| {name} | {stats['median']:,.2f} | {stats['min']:,.2f} | {stats['max']:,.2f} | {unit} |")
print("\n| derived, per round | median | min | max | what it is |")
print("| --- | --- | --- | --- | --- |")
for name, stats in derived.items():
    print(f"| {name} | {stats['median']:.3f} | {stats['min']:.3f} | {stats['max']:.3f} | {meaning[name]} |")
print()
for line in explained or ["one process only: no all-reduce to measure (--nprocs 1,2 needs 2 GPUs or cores)"]:
    print(textwrap.fill(line, width=88, subsequent_indent="  "))
for command in retried:
    print(f"failed once, and ran again (its reason is above): {command}")
print(f"\nwritten to {args.json}")
