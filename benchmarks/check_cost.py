"""What watching costs: check_ddp.py on a script against the script's own torchrun run, side by side.

    python benchmarks/check_cost.py                          # train_ddp.py at its defaults, 3 rounds
    python benchmarks/check_cost.py --rounds 5 tests/check_ddp_cases/mnist_ok.py
    python benchmarks/check_cost.py --rounds 5 --keep benchmarks/check_cost.kept.json   # the pages' figure

Each round runs, in a rotated order, the script as a user would (`torchrun --standalone
--nproc_per_node=2 SCRIPT`) and its check (`python check_ddp.py SCRIPT`), each in a fresh
folder, and times the whole command, start-up included. It prints every round, the median of
each, and the ratio check / run within each round (this machine is noisy: runs made side by
side are compared). No test asserts these times.
"""

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from environment import Kept  # benchmarks/environment.py

ROOT = Path(__file__).resolve().parent.parent

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("script", nargs="?", default=str(ROOT / "train_ddp.py"), help="default: train_ddp.py")
parser.add_argument("--rounds", type=int, default=3, help="rounds of both commands (default: 3)")
parser.add_argument(
    "--keep", metavar="FILE", help="also write the output, date, machine and load to FILE (JSON)"
)
args = parser.parse_args()
out = Kept(args.keep)
script = Path(args.script).resolve()
if not script.is_file():
    parser.error(f"{args.script}: no such file")
commands = {
    "run": [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", script.name],
    "check": [sys.executable, str(ROOT / "check_ddp.py"), script.name],
}
env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # the CPU, gloo: the machine workshops run on

rounds = []
for r in range(args.rounds):
    seconds = {}
    for name in list(commands)[r % 2 :] + list(commands)[: r % 2]:  # alternate which goes first
        folder = Path(tempfile.mkdtemp(prefix="check_cost-"))
        shutil.copy(script, folder / script.name)
        start = time.perf_counter()
        proc = subprocess.run(commands[name], cwd=folder, env=env, capture_output=True, text=True)
        seconds[name] = time.perf_counter() - start
        shutil.rmtree(folder)
        if proc.returncode not in (0, 1) or (name == "run" and proc.returncode):
            sys.exit(
                f"check_cost: {name} exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}"
            )
    rounds.append(seconds)
    out.say(f"round {r + 1}: run {seconds['run']:.1f} s, check {seconds['check']:.1f} s")

ratios = [one["check"] / one["run"] for one in rounds]
out.say(
    f"\n{script.name}, 2 processes on the CPU, {args.rounds} rounds; load average {os.getloadavg()[0]:.1f}"
)
medians = {}
for name in commands:
    values = [one[name] for one in rounds]
    medians[name] = statistics.median(values)
    out.say(f"{name:5}  median {medians[name]:.1f} s  ({min(values):.1f} to {max(values):.1f})")
out.say(
    f"check / run, per round: median {statistics.median(ratios):.2f} ({min(ratios):.2f} to {max(ratios):.2f})"
)
out.save(
    f"{os.cpu_count()}-core {platform.machine()} CPU",
    rounds=rounds,
    median_s=medians,
    check_over_run=statistics.median(ratios),
)
