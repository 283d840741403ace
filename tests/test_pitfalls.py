"""Every pitfall in pitfalls/ runs alone, as its docstring says, and its own checks hold: the mistake
and the fix each did what the pitfall says they do. Pitfall 13's lesson is a speed, and no test
judges a speed: its test checks what it ran, and that it timed both."""

import ast
import os
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
from helpers import ROOT, cpu_env, run, selected

PITFALLS = sorted(p.name for p in (ROOT / "pitfalls").glob("*.py") if not p.name.startswith("_"))
# the steps a pitfall's name may carry: the ten DDP steps of the README, and the FSDP steps, the four
# of them FSDP2 (fully_shard) changes, each under the number of the DDP step it replaces
STEPS = {"DDP": range(1, 11), "FSDP": (4, 6, 9, 10)}


def test_every_classic_mistake_has_its_pitfall():
    assert len(PITFALLS) >= 20, PITFALLS
    assert sum(name.startswith("fsdp_") for name in PITFALLS) >= 4, PITFALLS


def test_each_pitfall_is_named_by_the_step_it_belongs_to():
    # stepN_what.py, N a DDP step; fsdp_stepN_what.py, N an FSDP step; never a number of its own
    # that reads as another step's
    for name in PITFALLS:
        match = re.fullmatch(r"(fsdp_)?step(\d+)_[a-z0-9_]+\.py", name)
        kind = "FSDP" if match and match.group(1) else "DDP"
        assert match and int(match.group(2)) in STEPS[kind], (
            f"{name}: name it stepN_what.py, N its DDP step, or fsdp_stepN_what.py, N its FSDP step"
            f" (one of {', '.join(map(str, STEPS['FSDP']))})"
        )
        first = ast.get_docstring(ast.parse((ROOT / "pitfalls" / name).read_text())).splitlines()[0]
        assert first.startswith(f"A pitfall of {kind} step {match.group(2)}: "), f"{name}: {first}"


def run_pitfall(name):
    # the CPU, for every process, even on a GPU machine; exit 0: the mistake and the fix both
    # behaved as the pitfall says
    return run(f"python pitfalls/{name}", cwd=ROOT, env=cpu_env(), timeout=90)


@pytest.fixture(scope="module")
def pitfall_runs(request):
    """The run of each pitfall this session tests, two at a time from the first test on, each test
    then waiting for its own: a pitfall mostly waits (for its processes to start, for the timeout
    that shows a hang), and two of them take little more time than one."""
    pool = ThreadPoolExecutor(max_workers=2)
    cases = selected(request, test_pitfall_shows_its_mistake_and_fix)
    timed = test_pitfall_13_times_all_cores_a_process_against_one_thread
    cases += [{"name": TIMED} for item in request.session.items if getattr(item, "function", None) is timed]
    yield {case["name"]: pool.submit(run_pitfall, case["name"]) for case in cases}
    pool.shutdown(cancel_futures=True)


# the quick tier (not slow) runs the one pitfall that starts no torchrun job
QUICK = "step6_unsafe_torch_load.py"
# the one whose symptom is a time: its own test, below
TIMED = "step8_too_many_threads.py"


@pytest.mark.parametrize(
    "name",
    [
        name if name == QUICK else pytest.param(name, marks=pytest.mark.slow)
        for name in PITFALLS
        if name != TIMED
    ],
)
def test_pitfall_shows_its_mistake_and_fix(pitfall_runs, name):
    command = f"python pitfalls/{name}"
    assert command in ast.get_docstring(ast.parse((ROOT / "pitfalls" / name).read_text())), (
        f"{name}: its docstring must hold the command that runs it, {command!r}"
    )
    lines = pitfall_runs[name].result().stdout.splitlines()
    assert lines[-1] == "as documented", lines
    assert len(lines) <= 12, f"{name}: a few lines, not a wall of output:\n" + "\n".join(lines)


@pytest.mark.slow
def test_pitfall_13_times_all_cores_a_process_against_one_thread(pitfall_runs):
    # how much slower the mistake is depends on the machine and on what else runs on it: the
    # pitfall prints it, and this test does not judge it (no test asserts a speed)
    lines = pitfall_runs[TIMED].result().stdout.splitlines()
    assert lines[-1] == "as documented", lines  # its own check: the threads each run had
    text = "\n".join(lines)
    cores = len(os.sched_getaffinity(0))
    assert f"OMP_NUM_THREADS={cores} (all {cores} cores) for each of 2 processes: {2 * cores} threads" in text
    mistake = re.search(r"^symptom: (\d+\.\d) ms per training step$", text, flags=re.M)
    fix = re.search(r"^result: +(\d+\.\d) ms per step with 1 thread each", text, flags=re.M)
    assert mistake and fix and float(mistake[1]) > 0 and float(fix[1]) > 0, text  # both were timed
