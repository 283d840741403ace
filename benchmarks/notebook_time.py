"""The notebook's own time: its default run, as a workshop attendee's, top to bottom.

    python benchmarks/notebook_time.py                   # one run
    python benchmarks/notebook_time.py --runs 2 --keep benchmarks/notebook_time.kept.json --add  # the pages'

Each run copies the project's tracked files into a fresh folder, as a clone has them, and times
`python -m jupyter nbconvert --to notebook --execute walkthrough.ipynb` there, start-up included,
with no WALKTHROUGH_* setting (2 rounds of its scaling measurement, as the notebook's default) and
no GPU. It prints what each run took, and the load average of the machine around it: a laptop with
other work on it takes longer. With --add, the runs a kept file already holds stay in it, each with
its own date, machine and load, so that the kept runs span the machines and loads they were made on:
the notebook states their range. No test asserts these times.
"""

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from environment import Kept, cpu  # benchmarks/environment.py

ROOT = Path(__file__).resolve().parent.parent

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--runs", type=int, default=1, help="runs of the notebook (default: 1)")
parser.add_argument(
    "--keep", metavar="FILE", help="also write the output, date, machine and load to FILE (JSON)"
)
parser.add_argument("--add", action="store_true", help="keep the runs FILE already holds, and add these")
args = parser.parse_args()
earlier = []
if args.add and args.keep and Path(args.keep).exists():
    earlier = json.loads(Path(args.keep).read_text())["runs"]
out = Kept(args.keep)
tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
env = {key: value for key, value in os.environ.items() if not key.startswith("WALKTHROUGH_")}
env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, gloo: the machine workshops run on
command = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "walkthrough.ipynb"]
machine = f"{os.cpu_count()}-core {platform.machine()} CPU"


def said(run):
    return (
        f"{run['date']}, {run['machine']} ({run['cpu']}), load average {run['load'][0]:.1f} to"
        f" {run['load'][1]:.1f}: {run['seconds']:.0f} s"
    )


for run in earlier:
    out.say(f"kept before: {said(run)}")
runs = []
for r in range(args.runs):
    folder = Path(tempfile.mkdtemp(prefix="notebook_time-"))
    for name in tracked.splitlines():
        if (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, folder / name)
    load = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.run(
        [*command, "--output", str(folder / "run.ipynb")], cwd=folder, env=env, capture_output=True, text=True
    )
    seconds = time.perf_counter() - start
    shutil.rmtree(folder)
    if proc.returncode:
        sys.exit(f"notebook_time: nbconvert exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    date = time.strftime("%Y-%m-%d", time.gmtime())
    runs.append(
        {
            "date": date,
            "machine": machine,
            "cpu": cpu(),
            "load": [load, os.getloadavg()[0]],
            "seconds": seconds,
        }
    )
    out.say(f"run {r + 1}: {said(runs[-1])}")

kept = earlier + runs
seconds = [run["seconds"] for run in kept]
out.say(f"\nwalkthrough.ipynb, default run: {min(seconds):.0f} to {max(seconds):.0f} s over {len(kept)} runs")
out.save(machine, runs=kept)
