"""Measure the twin scripts side by side: DDP overhead, scaling, and time to first result.

    python benchmarks/benchmark.py                        # about 2 minutes on 2 CPU cores
    python benchmarks/benchmark.py --nprocs 1,2,4 --repeats 5 --json out/benchmark.json

Each round runs every case once, in a rotated order, and the benchmark repeats rounds
(--repeats, at least 3): these machines are noisy, so numbers measured side by side,
in the same round, are compared, and medians with min and max are reported. It prints
a table and writes it as JSON. Throughput comes from the scripts' own metrics.jsonl
(the loop's clock, start-up excluded): the median epoch after the first.

Every training run gets OMP_NUM_THREADS=1: torchrun sets it when it starts several
processes but not for one, which would let 1 process use every core and make any
scaling look flat. With it, N processes use N cores.
"""

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
REGIMES = {  # the scaling presets: flags for train_ddp.py, per process
    "small": ["--hidden_size", "64", "--batch_size", "64", "--dataset_size", "16384"],
    "wide": ["--hidden_size", "512", "--batch_size", "1024", "--dataset_size", "32768"],
}
TARGETS = {
    "ddp_overhead_small": 0.97,
    "ddp_overhead_wide": 0.97,
    "wide_efficiency_n2": 0.9,
    "first_result_gap_s": 1.5,
}

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--repeats", type=int, default=3, help="rounds of every case, at least 3 (default: 3)")
parser.add_argument(
    "--nprocs",
    help="process counts for scaling, e.g. 1,2,4 (default: 1, 2, 4 capped at the GPUs, else the CPU cores)",
)
parser.add_argument(
    "--json", default="out/benchmark.json", help="where the results go (default: %(default)s)"
)
args = parser.parse_args()
if args.repeats < 3:
    parser.error("--repeats must be at least 3: one run of a noisy machine measures nothing")
slots = torch.cuda.device_count() or os.cpu_count()
nprocs = [int(n) for n in args.nprocs.split(",")] if args.nprocs else [n for n in (1, 2, 4) if n <= slots]
if nprocs[0] != 1:
    parser.error("--nprocs must start with 1: efficiency is measured against one process")

env = dict(os.environ, OMP_NUM_THREADS="1")
scratch = Path(tempfile.mkdtemp(prefix="benchmark-"))


def launch(script, flags, nproc):
    """The command a user would type: python for the baseline, torchrun for the rest."""
    if nproc is None:
        return [sys.executable, script, *flags]
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        script,
        *flags,
    ]


def throughput(script, flags, nproc=None):
    out = scratch / f"run{len(list(scratch.iterdir()))}"
    command = launch(script, [*flags, "--epochs", "4", "--out_dir", str(out)], nproc)
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
    epochs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return statistics.median(r["samples_per_sec"] for r in epochs[1:])


def wall_time(script, flags=()):
    out = scratch / f"run{len(list(scratch.iterdir()))}"
    out_flags = ["--out_dir", str(out)] if script == "train_ddp.py" else []
    start = time.perf_counter()
    subprocess.run(
        launch(script, [*flags, *out_flags], 2), cwd=ROOT, env=env, check=True, capture_output=True
    )
    return time.perf_counter() - start


cases = {
    "first result": lambda: wall_time("train_ddp.py"),
    "floor": lambda: wall_time("benchmarks/floor.py"),
}
for regime, flags in REGIMES.items():
    cases[f"{regime} baseline"] = lambda flags=flags: throughput("single_gpu_baseline.py", flags)
    for n in nprocs:
        cases[f"{regime} N={n}"] = lambda flags=flags, n=n: throughput("train_ddp.py", flags, n)
accumulating = nprocs[1] if len(nprocs) > 1 else None  # step 9's effect, where gradients are exchanged
if accumulating:
    accum_flags = [*REGIMES["small"], "--grad_accum_steps", "4"]
    cases[f"small N={accumulating} K=4"] = lambda: throughput("train_ddp.py", accum_flags, accumulating)

rounds = []
for r in range(args.repeats):
    names = list(cases)
    names = names[r % len(names) :] + names[: r % len(names)]  # rotate, so no case always goes first
    rounds.append({name: cases[name]() for name in names})
    print(f"round {r + 1}/{args.repeats} done", file=sys.stderr, flush=True)
shutil.rmtree(scratch)


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


results = {name: summary([one[name] for one in rounds]) for name in cases}
derived = {  # ratios within each round, then their median, min and max
    "first_result_gap_s": summary([one["first result"] - one["floor"] for one in rounds]),
}
for regime in REGIMES:  # DDP overhead: train_ddp.py at N=1 against the baseline, on the same work
    derived[f"ddp_overhead_{regime}"] = summary(
        [one[f"{regime} N=1"] / one[f"{regime} baseline"] for one in rounds]
    )
for regime in REGIMES:
    for n in nprocs[1:]:
        derived[f"{regime}_efficiency_n{n}"] = summary(
            [one[f"{regime} N={n}"] / (n * one[f"{regime} N=1"]) for one in rounds]
        )
if accumulating:  # --grad_accum_steps 4 against 1: a quarter of the all-reduces, the same samples
    derived[f"small_accum_k4_speedup_n{accumulating}"] = summary(
        [one[f"small N={accumulating} K=4"] / one[f"small N={accumulating}"] for one in rounds]
    )

if torch.cuda.is_available():
    machine = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}, nccl"
else:
    machine = f"{os.cpu_count()}-core {platform.machine()} CPU, gloo"
report = {
    "machine": machine,
    "torch": torch.__version__,
    "python": platform.python_version(),
    "command": " ".join(["python", "benchmarks/benchmark.py", *sys.argv[1:]]),
    "repeats": args.repeats,
    "measured": results,
    "derived": derived,
    "targets": TARGETS,
}
Path(args.json).parent.mkdir(parents=True, exist_ok=True)
Path(args.json).write_text(json.dumps(report, indent=2) + "\n")

print(f"{machine}; torch {torch.__version__}; {args.repeats} rounds; median (min - max)\n")
print("| measurement | median | min | max | unit |")
print("| --- | --- | --- | --- | --- |")
for name, stats in results.items():
    unit = "s (wall, whole job)" if name in ("first result", "floor") else "samples/s"
    print(f"| {name} | {stats['median']:,.2f} | {stats['min']:,.2f} | {stats['max']:,.2f} | {unit} |")
print("\n| derived, per round | median | min | max | target |")
print("| --- | --- | --- | --- | --- |")
for name, stats in derived.items():
    target = TARGETS.get(name)
    if target is None:
        verdict = ""
    elif name.endswith("_s"):
        verdict = f"at most {target} ({'met' if stats['median'] <= target else 'missed'})"
    else:
        verdict = f"at least {target} ({'met' if stats['median'] >= target else 'missed'})"
    print(f"| {name} | {stats['median']:.3f} | {stats['min']:.3f} | {stats['max']:.3f} | {verdict} |")
print(f"\nwritten to {args.json}")
