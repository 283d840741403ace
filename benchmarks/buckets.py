"""What DDP's bucket size changes, measured: train_ddp.py --profile at each --bucket_cap_mb, side by side.

    python benchmarks/buckets.py                      # the wide model, 2 processes: 3 minutes on 2 cores
    python benchmarks/buckets.py --caps torch,25,0.25,0.001 --repeats 5
    python benchmarks/buckets.py --regime large --repeats 1 --out out/gpu_checks/buckets   # on GPUs
    python benchmarks/buckets.py --keep benchmarks/buckets.kept.json   # the page's figures

Each round runs train_ddp.py once per bucket size ("torch": the flag not given, torch's own
default), in an order rotated from round to round, with --profile, which records batches 3 to 6
of epoch 2; the regimes are benchmark.py's. From each run it reads
- from each rank's trace: its all-reduces per optimizer step (the buckets), their time per step,
  and the share of that time hidden under backward (the notebook's numbers, from
  traces.py);
- from metrics.jsonl: samples/s, the median of the epochs after the recorded one.
It prints a table of medians, with min and max over the rounds, writes OUT/buckets.json, and keeps
the first round's traces (OUT/<case>/trace_rank*.json) and their timeline, OUT/timeline.png.
Every process gets one thread (OMP_NUM_THREADS=1), as in benchmark.py. No test asserts a number;
--keep writes the table, with the date, the machine and its load, to a small JSON file, from which
tests/test_figures.py reads the page's figures.
"""

import argparse
import ast
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from environment import Kept  # benchmarks/environment.py

ROOT = Path(__file__).resolve().parent.parent


def regimes():
    """benchmark.py's REGIMES, read from its source (importing it would run it): written once."""
    tree = ast.parse((ROOT / "benchmarks/benchmark.py").read_text())
    node = next(
        n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "REGIMES"
    )
    return ast.literal_eval(node.value)


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument(
    "--caps", default="torch,25,0.001", help="bucket sizes in MiB; torch: its default (default: %(default)s)"
)
parser.add_argument("--regime", choices=list(regimes()), help="default: large on GPUs, wide on a CPU")
parser.add_argument("--nproc", type=int, help="processes (default: 2, or the GPUs if fewer)")
parser.add_argument("--repeats", type=int, default=3, help="rounds of every bucket size (default: 3)")
parser.add_argument(
    "--out", default="out/buckets", help="where the traces, figure and JSON go (default: %(default)s)"
)
parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="(default: auto)")
parser.add_argument(
    "--keep", metavar="FILE", help="also write the table, date, machine and load to FILE (JSON)"
)
args = parser.parse_args()
kept = Kept(args.keep and os.path.abspath(args.keep))
cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
if cuda and not torch.cuda.is_available():
    parser.error("--device cuda: PyTorch sees no CUDA GPU on this machine; use --device cpu")
regime = args.regime or ("large" if cuda else "wide")
nproc = args.nproc or min(2, torch.cuda.device_count() if cuda else os.cpu_count())
caps = args.caps.split(",")
out = Path(args.out).resolve()
os.chdir(ROOT)  # the runs below are the project's commands, run from its folder
sys.path.insert(0, str(ROOT))
from traces import communication, draw_timelines, read_traces  # noqa: E402

if cuda:
    machine = f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}, nccl"
else:
    machine = f"{os.cpu_count()}-core {platform.machine()} CPU, gloo"
label = f"{regime} model, {nproc} processes; {machine}; torch {torch.__version__}"
env = dict(os.environ, OMP_NUM_THREADS="1")
scratch = Path(tempfile.mkdtemp(prefix="buckets-"))
out.mkdir(parents=True, exist_ok=True)


def run(cap, folder):
    """One profiled run of train_ddp.py; what its traces and metrics say."""
    flags = [*regimes()[regime], "--epochs", "4", "--save_interval", "4", "--profile"]
    flags += ["--device", "cuda" if cuda else "cpu"]
    flags += [] if cap == "torch" else ["--bucket_cap_mb", cap]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}"]
    proc = subprocess.run(
        [*torchrun, "train_ddp.py", *flags, "--out_dir", str(folder)], env=env, capture_output=True, text=True
    )
    if proc.returncode:
        sys.exit(f"buckets: --bucket_cap_mb {cap} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    for checkpoint in folder.glob("*.pt"):
        checkpoint.unlink()  # the large model's are 200 MB
    epochs = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
    ranks = [communication(trace) for trace in read_traces(folder)]
    return {
        "samples_per_sec": statistics.median(r["samples_per_sec"] for r in epochs[2:]),  # after the recorded
        "buckets": [r["all-reduces"] / r["optimizer steps"] for r in ranks],
        "all_reduce_ms": [r["all-reduce ms"] / r["optimizer steps"] for r in ranks],
        "hidden": [r["hidden"] for r in ranks],
    }


rounds = []
for k in range(args.repeats):
    order = caps[k % len(caps) :] + caps[: k % len(caps)]  # rotated, so that no size always goes first
    rounds.append({})
    for cap in order:
        folder = out / cap if k == 0 else scratch / f"{cap}-{k}"  # the first round's are kept
        shutil.rmtree(folder, ignore_errors=True)
        rounds[-1][cap] = run(cap, folder)
    print(f"round {k + 1}/{args.repeats} done", file=sys.stderr, flush=True)
shutil.rmtree(scratch, ignore_errors=True)


def summary(values, spec):
    text = f"{statistics.median(values):{spec}}"
    return text if len(values) == 1 else f"{text} ({min(values):{spec}} to {max(values):{spec}})"


def per_rank(cap, key, spec):
    """A summary for each rank; "none" where no all-reduce was recorded (one GPU may run none)."""
    values = [[one[cap][key][r] for one in rounds if one[cap][key][r] is not None] for r in range(nproc)]
    return " / ".join(summary(v, spec) if v else "none" for v in values)


rounds_run = f"{args.repeats} rounds; median (min to max)" if args.repeats > 1 else "1 round"
kept.say(f"{label}; {rounds_run}\n")
kept.say(
    "| --bucket_cap_mb | buckets a step | all-reduce ms a step, by rank | hidden under backward, by rank "
    "| samples/s |\n| --- | --- | --- | --- | --- |"
)
for cap in caps:
    buckets = sorted({b for one in rounds for b in one[cap]["buckets"]})
    speed = summary([one[cap]["samples_per_sec"] for one in rounds], ",.0f")
    kept.say(
        f"| {cap} | {', '.join(f'{b:g}' for b in buckets)} | {per_rank(cap, 'all_reduce_ms', '.1f')} | "
        f"{per_rank(cap, 'hidden', '.0%')} | {speed} |"
    )
first = {
    f"--bucket_cap_mb {cap}" if cap != "torch" else "torch's buckets": read_traces(out / cap) for cap in caps
}
draw_timelines(first, title=f"The first 2 recorded steps of round 1; {label}").savefig(
    out / "timeline.png", dpi=100
)
(out / "buckets.json").write_text(
    json.dumps({"label": label, "caps": caps, "rounds": rounds}, indent=2) + "\n"
)
print(f"\nthe traces: {out}/<bucket_cap_mb>/trace_rank*.json; their timeline: {out / 'timeline.png'}")
print(f"every number: {out / 'buckets.json'}")
kept.save(machine, label=label, caps=caps, rounds=rounds)
