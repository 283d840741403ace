"""The notebook's own time: its default run, as a workshop attendee's, top to bottom.

    python benchmarks/notebook_time.py                   # one run
    python benchmarks/notebook_time.py --runs 2 --keep benchmarks/notebook_time.kept.json  # the pages'

Each run copies the project's tracked files into a fresh folder, as a clone has them, and times
`python -m jupyter nbconvert --to notebook --execute walkthrough.ipynb` there, start-up included,
with no WALKTHROUGH_* setting (2 rounds of its scaling measurement, as the notebook's default) and
no GPU. The notebook promises two to three minutes on a 2-core laptop: this prints what it took.
No test asserts these times.
"""

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from environment import Kept  # benchmarks/environment.py

ROOT = Path(__file__).resolve().parent.parent

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--runs", type=int, default=1, help="runs of the notebook (default: 1)")
parser.add_argument(
    "--keep", metavar="FILE", help="also write the output, date, machine and load to FILE (JSON)"
)
args = parser.parse_args()
out = Kept(args.keep)
tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
env = {key: value for key, value in os.environ.items() if not key.startswith("WALKTHROUGH_")}
env["CUDA_VISIBLE_DEVICES"] = ""  # the CPU, gloo: the machine workshops run on
command = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute", "walkthrough.ipynb"]

seconds = []
for r in range(args.runs):
    folder = Path(tempfile.mkdtemp(prefix="notebook_time-"))
    for name in tracked.splitlines():
        if (ROOT / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, folder / name)
    start = time.perf_counter()
    proc = subprocess.run(
        [*command, "--output", str(folder / "run.ipynb")], cwd=folder, env=env, capture_output=True, text=True
    )
    seconds.append(time.perf_counter() - start)
    shutil.rmtree(folder)
    if proc.returncode:
        sys.exit(f"notebook_time: nbconvert exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    out.say(f"run {r + 1}: {seconds[-1]:.0f} s")

out.say(f"\nwalkthrough.ipynb, default run, load average {os.getloadavg()[0]:.1f}")
out.say(f"slowest of {args.runs}: {max(seconds):.0f} s")
out.save(f"{os.cpu_count()}-core {platform.machine()} CPU", seconds=seconds)
