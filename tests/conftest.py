"""Runs that several tests read, made once per test session: the `shared_run` fixture.

A proof compares runs (the baseline at batch 64 with DDP at N x 64/N, a run with its own
resumption), and tests in several modules compare the same ones: test_proofs and test_twins both
resume the 2-process run at batch 32, test_faults and test_proofs both restart the small run that
saves every epoch. Each such run is made once, the first time a test names it: the same command
(and the same scripts) is the same run. Nearly all of a run's time is its processes' start-up, so
a run made once instead of in each test that reads it is that much less to wait for.

    base, ddp = shared_run("python single_gpu_baseline.py ...", "torchrun ... train_ddp.py ...")

runs each command that was not made yet in a folder of its own, holding a copy of the scripts,
two at a time (a start-up is mostly one core waiting on imports: two of them share the 2 cores of
a small machine), and returns what each run left: a Run. A test that changes a run's files works
on a copy of its folder (Run.copy_to), so that every other test reads the run as it was made.
"""

import hashlib
import os
import platform
import re
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import ROOT, SCRIPTS, audit_env, copy_scripts, run

# what a command here may run: the scripts, and the tools that wrap them
SOURCES = [ROOT / name for name in SCRIPTS] + [ROOT / "tests/fault.py", ROOT / "tests/count_allreduce.py"]


@dataclass(frozen=True)
class Run:
    """What a command left: the folder it ran in, its output folder in there, what it printed."""

    folder: Path  # a copy of the scripts, and everything the run wrote
    out: Path  # its --out_dir, or the out/<script>/run_1 it chose without one
    proc: subprocess.CompletedProcess
    seconds: float

    def copy_to(self, dest):
        """A copy of the run's folder at dest, to go on from there (resume it, damage it) as a user
        would in the run's own folder: the same commands, the same relative paths."""
        shutil.copytree(self.folder, dest, dirs_exist_ok=True)
        return Path(dest)


def out_dir(command, folder):
    """Where the command's run writes: its --out_dir, else the run_N folder the script made."""
    argv = command.split()
    if "--out_dir" in argv:
        return folder / argv[argv.index("--out_dir") + 1]
    made = sorted(folder.glob("out/*/run_*"))
    return made[0] if len(made) == 1 else folder / "out"


@pytest.fixture(scope="session")
def shared_run(tmp_path_factory):
    """shared_run(command, ...): the Run of each command, made once per session (see above).

    audit=True: every process reports each file it writes under out/ on its stderr, with its rank
    (helpers.audit_env). expect: the exit status the commands must end with."""
    root = tmp_path_factory.mktemp("shared_runs")
    made = {}  # (command, audit, expect, the sources' digest) -> the Future of its Run
    pool = ThreadPoolExecutor(max_workers=2)

    def make(command, folder, audit, expect, timeout):
        copy_scripts(folder)
        env = audit_env(folder, watch=folder / "out") if audit else None
        start = time.monotonic()
        proc = run(command, cwd=folder, env=env, expect=expect, timeout=timeout)
        return Run(folder, out_dir(command, folder), proc, time.monotonic() - start)

    def shared_run(*commands, audit=False, expect=0, timeout=180):
        digest = hashlib.sha256(b"".join(path.read_bytes() for path in SOURCES)).hexdigest()
        futures = []
        for command in commands:
            command = " ".join(command.split())
            key = (command, audit, expect, digest)
            if key not in made:
                name = re.sub(r"[^\w.=-]+", "_", command.replace(str(ROOT), ""))[:80]
                folder = root / f"{name}-{hashlib.sha256(repr(key).encode()).hexdigest()[:8]}"
                folder.mkdir()
                made[key] = pool.submit(make, command, folder, audit, expect, timeout)
            futures.append(made[key])
        runs = [future.result() for future in futures]  # a failed run fails every test that reads it
        return runs[0] if len(runs) == 1 else runs

    yield shared_run
    pool.shutdown(cancel_futures=True)


COLLECTED = pytest.StashKey[list]()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Every test this session collected, before -m or -k chose among them, and whether it is slow:
    what the kept runs of each tier must have run (test_figures.py)."""
    config.stash[COLLECTED] = [(item.nodeid, item.get_closest_marker("slow") is not None) for item in items]


@pytest.fixture(scope="session")
def collected(request):
    """[(node id, slow), ...]: every test of the files this session collected (see above)."""
    return request.config.stash[COLLECTED]


@pytest.fixture(scope="session", autouse=True)
def where_the_suite_ran(record_testsuite_property):
    """With --junitxml (tests/timings/ keeps such reports, tests/README.md quotes them), the report says
    what the suite ran on and under what load, beside pytest's own date, host and times."""
    cpu = (
        re.search(r"^model name\s*: (.+)$", Path("/proc/cpuinfo").read_text(), re.M)
        if os.path.exists("/proc/cpuinfo")
        else None
    )
    record_testsuite_property(
        "machine", f"{os.cpu_count()}-core {platform.machine()} CPU, {cpu[1] if cpu else '?'}"
    )
    record_testsuite_property("load_average_start", f"{os.getloadavg()[0]:.1f}")
    yield
    record_testsuite_property("load_average_end", f"{os.getloadavg()[0]:.1f}")
