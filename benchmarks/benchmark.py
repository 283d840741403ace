"""Measure the twin scripts side by side: DDP overhead, scaling and what limits it, time to first result.

    python benchmarks/benchmark.py                        # about 4 minutes on 2 CPU cores
    python benchmarks/benchmark.py --nprocs 1,2,4 --repeats 5 --json out/benchmark.json
    python benchmarks/benchmark.py --device cpu           # the CPU (gloo) even on a GPU machine
    python benchmarks/benchmark.py --budget 240           # as many rounds as fit in 4 minutes
    python benchmarks/benchmark.py --keep benchmarks/benchmark.kept.json   # the page's figures

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
printed; a second failure, or a run past --run_timeout, stops the benchmark. The JSON
is written after every run, so that a stop, or a kill from outside, keeps what was
measured; the tables summarise the rounds that were completed. --keep also writes what it
printed, with the date, the machine and its load, to a small JSON file: the page's figures are
read from it (tests/test_figures.py).

Where scaling goes is measured, not guessed: the largest N is run a second time with
DDP's gradient all-reduce skipped (benchmarks/no_comm.py, torch's noop_hook), in the
same rounds, and the difference is the share of a step the all-reduce takes.

On GPUs a third regime runs, "large", sized so that an epoch is close to a second of
float32 compute on one H200 (benchmarks/README.md has the arithmetic): the small and wide
ones, sized for a CPU, measure kernel launches and Python on a GPU.
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
from environment import Kept, describe  # benchmarks/environment.py

ROOT = Path(__file__).resolve().parent.parent
REGIMES = {  # the scaling presets: flags for train_ddp.py, per process
    "small": ["--hidden_size", "64", "--batch_size", "64", "--dataset_size", "16384"],
    "wide": ["--hidden_size", "512", "--batch_size", "1024", "--dataset_size", "32768"],
    # sized for a GPU: about 0.8 s of float32 compute an epoch on an H200 (benchmarks/README.md)
    "large": ["--hidden_size", "4096", "--batch_size", "4096", "--dataset_size", "524288"],
}
GPU_ONLY = {"large"}  # on a CPU, an epoch of it would take minutes

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
parser.add_argument(
    "--budget",
    type=float,
    help="seconds: start no round that would end past them, judged by the slowest round so far "
    "(default: no limit)",
)
parser.add_argument(
    "--keep", metavar="FILE", help="also write the report, date, machine and load to FILE (JSON)"
)
parser.add_argument(
    "--run_timeout",
    type=float,
    default=120,
    help="seconds one run may take; one that takes longer is stopped, and so is the benchmark (default: 120)",
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
regimes = {name: flags for name, flags in REGIMES.items() if use_cuda or name not in GPU_ONLY}
if use_cuda and slots == 1:
    scope = (
        "1 GPU: what one GPU can measure, DDP at N=1 against the baseline (ddp_overhead_*); the check that "
        "a step makes no host sync, and checkpoints across devices, are the GPU tests (gpu_checks.sh runs "
        "them); scaling and the all-reduce's share need 2 GPUs or more"
    )
elif widest is None:
    scope = "one process only: no scaling, no all-reduce to measure (--nprocs 1,2 needs 2 GPUs or cores)"
else:
    scope = (
        f"{slots} {'GPUs' if use_cuda else 'cores'}: scaling to N={widest}, and the all-reduce's share there"
    )

env = dict(os.environ, OMP_NUM_THREADS="1")
scratch = Path(tempfile.mkdtemp(prefix="benchmark-"))
run_ids = itertools.count()
retried = []  # the runs that failed once


class Stopped(Exception):
    """A run failed twice, or took longer than --run_timeout: no more runs."""


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
    that fails is run again once, after its reason is printed; a second failure, or a
    run past --run_timeout (a hang, most likely), raises Stopped with the reason."""
    for attempt in (1, 2):
        out = scratch / f"run{next(run_ids)}"
        command = command_for(out)
        start = time.perf_counter()
        proc = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        try:
            _, stderr = proc.communicate(timeout=args.run_timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()  # torchrun stops its workers on SIGTERM (they run in sessions of their own)
            try:
                _, stderr = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                _, stderr = proc.communicate()
            raise Stopped(
                f"a run took more than {args.run_timeout:.0f} s and was stopped:\n  {' '.join(command)}\n"
                f"{reason(stderr)}"
            ) from None
        seconds = time.perf_counter() - start
        if proc.returncode == 0:
            return out, seconds
        failure = f"a run failed (exit {proc.returncode}):\n  {' '.join(command)}\n{reason(stderr)}"
        if attempt == 1:
            print(f"benchmark: {failure}\nbenchmark: running it again", file=sys.stderr, flush=True)
            retried.append(" ".join(command))
    raise Stopped(f"twice {failure}")


def throughput(script, flags, nproc=None, wrapper=None):
    out, _ = run(
        lambda out: launch(
            script, [*flags, *device_flags, "--epochs", "4", "--out_dir", str(out)], nproc, wrapper
        )
    )
    epochs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    shutil.rmtree(out)  # the large regime's checkpoints are 134 MB each
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
    "first result": lambda: wall_time("train_ddp.py"),  # a first run: 2 processes, at its defaults
    "floor": lambda: wall_time("benchmarks/floor.py"),
}
for regime, flags in regimes.items():
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

# -----------------------------------------------------------------------------
# what the rounds say: ratios within each round, then their median, min and max


def summary(values):
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def flag(regime, name):
    flags = REGIMES[regime]
    return int(flags[flags.index(name) + 1])


def summarize(rounds):
    """Every case and every ratio over the rounds given (complete ones), and a sentence per
    regime on where its scaling goes."""
    results = {name: summary([one[name] for one in rounds]) for name in cases}
    derived = {"first_result_gap_s": summary([one["first result"] - one["floor"] for one in rounds])}
    meaning = {"first_result_gap_s": "first result - floor: the job's own start-up and training"}
    for regime in regimes:
        derived[f"ddp_overhead_{regime}"] = summary(
            [one[f"{regime} N=1"] / one[f"{regime} baseline"] for one in rounds]
        )
        meaning[f"ddp_overhead_{regime}"] = "N=1 / baseline: what DDP costs with nothing to share"
    if "large" in regimes:  # its hidden-by-hidden layer: 2 h^2 FLOP a sample forward, twice that backward
        flops = 6 * flag("large", "--hidden_size") ** 2
        derived["large_baseline_tflops"] = summary([one["large baseline"] * flops / 1e12 for one in rounds])
        meaning["large_baseline_tflops"] = (
            "baseline samples/s x 6 hidden^2 FLOP: the float32 TFLOP/s it reached"
        )
    for regime in regimes:
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
            meaning[f"{regime}_allreduce_share_n{widest}"] = (
                "1 - with / without: the share of a step it takes"
            )
    if accumulating:  # --grad_accum_steps 4 against 1: a quarter of the all-reduces, the same samples
        derived[f"small_accum_k4_speedup_n{accumulating}"] = summary(
            [one[f"small N={accumulating} K=4"] / one[f"small N={accumulating}"] for one in rounds]
        )
        meaning[f"small_accum_k4_speedup_n{accumulating}"] = "K=4 / K=1: a quarter of the all-reduces"

    explained = []  # where the scaling goes, in a sentence per regime, with the numbers of one round
    for regime in regimes if widest else ():
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
    return {"measured": results, "derived": derived, "meaning": meaning, "explained": explained}


# -----------------------------------------------------------------------------
# the rounds, written to the JSON after every run

if use_cuda:
    machine = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}, nccl"
else:
    machine = f"{os.cpu_count()}-core {platform.machine()} CPU, gloo"
report = {
    "machine": machine,
    "gpus": torch.cuda.device_count() if use_cuda else 0,
    "scope": scope,
    "torch": torch.__version__,
    "python": platform.python_version(),
    "environment": describe(),  # CUDA, NCCL, the GPUs, the packages
    "command": " ".join(["python", "benchmarks/benchmark.py", *sys.argv[1:]]),
    "repeats": args.repeats,
}
load = {"start": os.getloadavg()[0]}  # the 1-minute load average: other work skews every number
out = Kept(args.keep)
rounds = []  # every number measured, round by round; the last may be cut short


def save(status):
    """Write everything measured so far: "running" until the end, so that a benchmark killed
    from outside leaves its numbers, and says that it did not finish."""
    complete = [one for one in rounds if len(one) == len(cases)]
    report.update(status=status, load_average=load, complete_rounds=len(complete), rounds=rounds)
    report.update(summarize(complete) if complete else {}, retried=retried)
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_name(path.name + ".tmp").write_text(json.dumps(report, indent=2) + "\n")
    os.replace(path.with_name(path.name + ".tmp"), path)  # whole, even if killed while writing


stopped = None  # why fewer rounds ran than were asked for
failed = False
seconds = []  # each round's
started = time.perf_counter()
for r in range(args.repeats):
    if args.budget and seconds and time.perf_counter() - started + max(seconds) > args.budget:
        stopped = f"--budget {args.budget:.0f} s: a round takes up to {max(seconds):.0f} s, and no other fits"
        break
    names = list(cases)
    names = names[r % len(names) :] + names[: r % len(names)]  # rotate, so no case always goes first
    round_start = time.perf_counter()
    rounds.append({})
    try:
        for name in names:
            rounds[-1][name] = cases[name]()
            save("running")
    except Stopped as stop:
        stopped, failed = str(stop), True
        print(f"benchmark: stopped: {stop}", file=sys.stderr, flush=True)
        break
    seconds.append(time.perf_counter() - round_start)
    print(f"round {r + 1}/{args.repeats} done in {seconds[-1]:.0f} s", file=sys.stderr, flush=True)
shutil.rmtree(scratch, ignore_errors=True)
load["end"] = os.getloadavg()[0]
save(f"stopped: {stopped}" if stopped else "done")

# -----------------------------------------------------------------------------
# report

complete = report["complete_rounds"]
if not complete:
    sys.exit(f"benchmark: no round was completed; what was measured is in {args.json}")
done = f"{complete} rounds" if complete == args.repeats else f"{complete} of {args.repeats} rounds"
minutes = (time.perf_counter() - started) / 60
out.say(f"{machine}; torch {torch.__version__}; {done} in {minutes:.1f} minutes; median, min and max")
out.say(
    f"load average {load['start']:.1f} at the start, {load['end']:.1f} at the end ({os.cpu_count()} cores)"
)
out.say(f"{scope}\n")
out.say("| measurement | median | min | max | unit |")
out.say("| --- | --- | --- | --- | --- |")
for name, stats in report["measured"].items():
    unit = f"s (wall, whole job, N={pair})" if name in ("first result", "floor") else "samples/s"
    out.say(f"| {name} | {stats['median']:,.2f} | {stats['min']:,.2f} | {stats['max']:,.2f} | {unit} |")
out.say("\n| derived, per round | median | min | max | what it is |")
out.say("| --- | --- | --- | --- | --- |")
for name, stats in report["derived"].items():
    meaning = report["meaning"][name]
    out.say(f"| {name} | {stats['median']:.3f} | {stats['min']:.3f} | {stats['max']:.3f} | {meaning} |")
out.say()
for line in report["explained"]:
    out.say(textwrap.fill(line, width=88, subsequent_indent="  "))
for command in retried:
    out.say(f"failed once, and ran again (its reason is above): {command}")
if stopped:
    out.say(f"fewer rounds than asked for: {stopped}")
print(f"\nwritten to {args.json}")
out.save(machine, minutes=minutes, **{key: report[key] for key in ("measured", "derived", "rounds", "scope")})
sys.exit(1 if failed else 0)
