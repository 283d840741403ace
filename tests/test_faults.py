"""Faults a careful user meets, through the real entry points: each ends in a correct run or in
one clear error line (non-zero exit, no traceback from our scripts), with no history lost, no
NaN saved and no stray file left."""

import ast
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from xml.etree import ElementTree

import pytest
import torch
from helpers import (
    FAULT,
    ROOT,
    SMALL,
    STRAIGHT,
    TORCHRUN,
    assert_fired,
    copy_scripts,
    cpu_env,
    load_checkpoint,
    read_metrics,
    run,
    run_at_once,
    selected,
)

TORCHRUN_2 = "torchrun --standalone --nproc_per_node=2"
# SMALL: 512 samples, 64 held out, a checkpoint every epoch (helpers.py)


@pytest.fixture
def work(tmp_path):
    return copy_scripts(tmp_path)


@pytest.fixture
def straight(shared_run):
    """The last checkpoint of a run never interrupted (STRAIGHT, made once a session, as test_proofs
    makes it too): what resumed runs must equal."""
    return load_checkpoint(shared_run(STRAIGHT).out / "model_epoch_4.pt")


@pytest.fixture
def two_epochs(shared_run, tmp_path):
    """A folder holding what a finished 2-epoch run of `python train_ddp.py` left in --out_dir run:
    a copy of one run, made once for the tests that go on from it."""
    return shared_run(f"python train_ddp.py --epochs 2 {SMALL} --out_dir run").copy_to(tmp_path)


def assert_bit_identical(a, b):
    for key, value in a["model_state_dict"].items():
        assert torch.equal(value, b["model_state_dict"][key]), key


def error_lines(proc, script="train_ddp.py"):
    return [line for line in proc.stderr.splitlines() if line.startswith(f"{script}: error:")]


def assert_one_clear_line(proc, message, script="train_ddp.py"):
    assert proc.returncode != 0, proc.stdout + proc.stderr
    errors = error_lines(proc, script)
    assert len(errors) == 1 and message in errors[0], proc.stderr
    assert f'{script}", line' not in proc.stderr, "the script itself printed a traceback"


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def strict_records(folder):
    """metrics.jsonl, parsed as strict JSON: a bare NaN or Infinity fails."""

    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    text = (folder / "metrics.jsonl").read_text()
    assert text.endswith("\n") or not text
    return [json.loads(line, parse_constant=refuse) for line in text.splitlines()]


# One job per --out_dir ---------------------------------------------------------------------


@pytest.mark.slow
def test_a_second_job_into_a_running_jobs_out_dir_is_refused_and_changes_nothing(work):
    # the first job holds still after its first checkpoint, until the test releases it
    command = f"{TORCHRUN_2} {FAULT} hold train_ddp.py --epochs 4 {SMALL} --out_dir shared".split()
    first = subprocess.Popen(
        [*TORCHRUN, *command[1:]],
        cwd=work,
        env=cpu_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not (work / "shared/model_epoch_1.pt").exists():
            assert time.monotonic() < deadline and first.poll() is None, first.communicate()
            time.sleep(0.2)
        before = snapshot(work / "shared")
        # --resume auto takes the running job's checkpoint, and then finds the folder locked
        second = run(
            f"{TORCHRUN_2} train_ddp.py --epochs 4 {SMALL} --resume auto --out_dir shared",
            cwd=work,
            expect=None,
        )
        after = snapshot(work / "shared")
    finally:
        (work / "release").touch()
        stdout, stderr = first.communicate(timeout=180)
    assert_fired(stderr, "hold")  # the first job was still running: a finished one holds no lock
    assert second.returncode == 1, second.stdout + second.stderr
    assert_one_clear_line(second, "--out_dir shared is in use by another run")
    assert after == before
    assert first.returncode == 0, stdout + stderr
    assert [r["epoch"] for r in strict_records(work / "shared")] == [1, 2, 3, 4]


@pytest.mark.slow
def test_two_jobs_started_together_into_one_out_dir_never_mix(work):
    command = f"{TORCHRUN_2} train_ddp.py --epochs 8 {SMALL} --out_dir together"
    jobs = run_at_once([command, command], cwd=work, expect=None)
    passed = [job for job in jobs if job.returncode == 0]
    assert len(passed) == 1, [job.stdout + job.stderr for job in jobs]
    for job in jobs:
        if job.returncode != 0:  # refused by the lock, or by the other job's first checkpoint
            errors = error_lines(job)
            assert len(errors) == 1 and "--out_dir together" in errors[0], job.stderr
            assert "is in use by another run" in errors[0] or "already holds" in errors[0], job.stderr
    assert [r["epoch"] for r in strict_records(work / "together")] == list(range(1, 9))
    assert load_checkpoint(work / "together/model_epoch_8.pt")["epoch"] == 8


# metrics.jsonl is never lost ---------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["not json\n", "\n"], ids=["a_non_json_line", "a_blank_line"])
def test_a_damaged_metrics_file_is_refused_and_kept_as_it_was(two_epochs, damage):
    work = two_epochs
    lines = (work / "run/metrics.jsonl").read_text().splitlines(keepends=True)
    (work / "run/metrics.jsonl").write_text(lines[0] + damage + "".join(lines[1:]))
    before = snapshot(work / "run")
    proc = run(f"python train_ddp.py --epochs 5 {SMALL} --resume auto --out_dir run", cwd=work, expect=2)
    assert_one_clear_line(proc, "metrics.jsonl line 2 is not an epoch's record")
    assert snapshot(work / "run") == before


@pytest.mark.slow
def test_a_last_line_cut_short_by_a_crash_is_dropped_and_the_rest_kept(two_epochs):
    work = two_epochs
    with open(work / "run/metrics.jsonl", "a") as metrics:
        metrics.write('{"epoch": 3, "lo')  # a crash in the middle of epoch 3's line
    run(f"python train_ddp.py --epochs 4 {SMALL} --resume auto --out_dir run", cwd=work)
    records = strict_records(work / "run")
    assert [r["epoch"] for r in records] == [1, 2, 3, 4]


# Divergence --------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["python", TORCHRUN_2])
def test_a_diverged_run_stops_with_one_line_and_saves_no_nan(work, launcher):
    proc = run(f"{launcher} train_ddp.py --lr 1e6 --epochs 4 {SMALL} --out_dir big_lr", cwd=work, expect=None)
    assert_one_clear_line(proc, "the run diverged")
    assert "try a smaller --lr" in error_lines(proc)[0]
    assert strict_records(work / "big_lr") == []  # nothing logged, and only strict JSON
    assert not list((work / "big_lr").glob("*.pt*")), "a checkpoint of a diverged run was written"


@pytest.mark.slow
def test_a_run_that_diverges_later_keeps_its_earlier_epochs(work):
    # --lr 1: epoch 1 ends with a loss far too large, but a number; epoch 2 with nan
    proc = run(f"python train_ddp.py --lr 1 --epochs 4 {SMALL} --out_dir later", cwd=work, expect=None)
    assert_one_clear_line(proc, "epoch 2: the loss is nan")
    assert [r["epoch"] for r in strict_records(work / "later")] == [1]
    assert sorted(p.name for p in (work / "later").glob("*.pt*")) == ["model_epoch_1.pt"]


# Saving ------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["python", TORCHRUN_2])
def test_a_full_disk_while_saving_says_so_and_keeps_the_previous_checkpoint(work, launcher):
    proc = run(
        f"{launcher} {FAULT} full@3 train_ddp.py --epochs 4 {SMALL} --out_dir full", cwd=work, expect=None
    )
    assert_fired(proc.stderr, "full@3")
    assert proc.returncode != 0
    errors = error_lines(proc)
    assert len(errors) == 1 and "No space left on device" in errors[0], proc.stderr
    if launcher == "python":  # under torchrun, the other rank may also report its lost connection to rank 0
        assert 'train_ddp.py", line' not in proc.stderr, "the script itself printed a traceback"
    assert sorted(p.name for p in (work / "full").iterdir()) == [
        ".lock",
        "metrics.jsonl",
        "model_epoch_1.pt",
        "model_epoch_2.pt",
    ], "a half-written checkpoint was left behind"
    assert load_checkpoint(work / "full/model_epoch_2.pt")["epoch"] == 2


@pytest.mark.slow
def test_a_checkpoint_is_on_disk_before_it_is_renamed_into_place(work):
    proc = run(f"python {FAULT} syncs train_ddp.py --epochs 1 {SMALL} --out_dir synced", cwd=work)
    assert_fired(proc.stderr, "syncs")
    trace = [line.split() for line in proc.stderr.splitlines() if line.startswith(("FSYNC", "REPLACE"))]
    final = str(work / "synced/model_epoch_1.pt")
    assert trace == [
        ["FSYNC", final + ".tmp"],  # the file's data
        ["REPLACE", final + ".tmp", final],
        ["FSYNC", str(work / "synced")],  # the rename
    ], trace


@pytest.mark.slow
def test_a_stray_temporary_file_of_a_killed_save_is_removed(two_epochs):
    work = two_epochs
    (work / "run/model_epoch_3.pt.tmp").write_bytes(b"half a checkpoint")
    run(f"python train_ddp.py --epochs 3 {SMALL} --resume auto --out_dir run", cwd=work)
    assert sorted(p.name for p in (work / "run").iterdir()) == [
        ".lock",
        "metrics.jsonl",
        "model_epoch_1.pt",
        "model_epoch_2.pt",
        "model_epoch_3.pt",
    ]


# Resuming ----------------------------------------------------------------------------------


# a job run as a requeued one is: --resume auto, which continues --out_dir if it holds a checkpoint
REQUEUED = f"{TORCHRUN_2} train_ddp.py {SMALL} --resume auto --out_dir requeued"


@pytest.fixture
def first_attempt(shared_run, tmp_path):
    """A folder holding what the first attempt of REQUEUED, for 2 epochs, left: in an empty --out_dir,
    --resume auto started fresh. A copy of one run, made once for the tests that go on from it."""
    return shared_run(f"{REQUEUED} --epochs 2").copy_to(tmp_path)


@pytest.mark.slow
def test_resume_auto_starts_fresh_then_continues_as_a_straight_run(first_attempt, straight):
    work = first_attempt
    assert [r["epoch"] for r in read_metrics(work / "requeued")] == [1, 2]  # fresh
    run(f"{REQUEUED} --epochs 4", cwd=work)  # again
    assert [r["epoch"] for r in read_metrics(work / "requeued")] == [1, 2, 3, 4]
    assert_bit_identical(straight, load_checkpoint(work / "requeued/model_epoch_4.pt"))


@pytest.mark.slow
def test_resuming_a_finished_run_says_so_and_changes_nothing(shared_run, tmp_path):
    work = shared_run(STRAIGHT).copy_to(tmp_path)  # 4 epochs, in --out_dir straight
    before = snapshot(work / "straight")
    proc = run(f"{STRAIGHT} --resume auto", cwd=work)
    assert proc.stdout.count("has done all 4 epochs; raise --epochs for more") == 1, proc.stdout
    assert snapshot(work / "straight") == before


@pytest.mark.slow
def test_fewer_epochs_than_the_checkpoint_has_done_is_refused(two_epochs):
    work = two_epochs
    proc = run(f"python train_ddp.py --epochs 1 {SMALL} --resume auto --out_dir run", cwd=work, expect=2)
    assert_one_clear_line(proc, "has trained 2 epochs, more than --epochs 1")


@pytest.mark.slow
def test_rank_0_chooses_the_checkpoint_every_rank_resumes(first_attempt, shared_run):
    # rank 1 sees --out_dir without its newest checkpoint, as a node with a stale view of a
    # shared filesystem may: it must still resume from rank 0's choice, with rank 0
    work = first_attempt
    stale = f"{TORCHRUN_2} {FAULT} stale@1 train_ddp.py --epochs 4 {SMALL} --resume auto --out_dir requeued"
    proc = run(stale, cwd=work)  # REQUEUED, again, for 4 epochs
    assert_fired(proc.stderr, "stale@1")  # rank 1 listed the folder, and missed model_epoch_2.pt
    assert "without model_epoch_2.pt" in proc.stderr
    assert [r["epoch"] for r in read_metrics(work / "requeued")] == [1, 2, 3, 4]
    straight = load_checkpoint(shared_run(STRAIGHT).out / "model_epoch_4.pt")  # made once, as `straight` is
    assert_bit_identical(straight, load_checkpoint(work / "requeued/model_epoch_4.pt"))


# Launching ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "given, missing",
    [
        ({"RANK": "0"}, "LOCAL_RANK and WORLD_SIZE"),
        ({"RANK": "0", "WORLD_SIZE": "1"}, "LOCAL_RANK"),
    ],
    ids=["RANK", "RANK_WORLD_SIZE"],
)
def test_half_a_torchrun_environment_gets_one_clear_line(work, given, missing):
    proc = run("python train_ddp.py --out_dir half", cwd=work, env=cpu_env(**given), expect=2)
    assert_one_clear_line(proc, f"{missing} not set: launch with torchrun, which sets them all")
    assert not (work / "half").exists()


def test_under_torchrun_a_refusal_is_printed_once_and_nothing_waits(work):
    # also test_proofs' bad-input case of the command line under torchrun
    proc = run(f"{TORCHRUN_2} train_ddp.py --batch_size 0", cwd=work, expect=1, timeout=60)
    assert_one_clear_line(proc, "--batch_size: must be a whole number of at least 1")
    assert proc.stderr.count("usage:") == 0
    # local rank 0 refused at once, and torchrun stopped local rank 1 during the seconds it gives
    # torchrun to do so (train_ddp.py's refuse()): no process waited for another to refuse too
    assert "failed (exitcode: 2) local_rank: 0" in proc.stderr, proc.stderr
    assert re.search(r"local_rank: 1\)\n +exitcode +: -15 .*\(SIGTERM\)", proc.stderr), proc.stderr
    assert not (work / "out").exists(), "a failed run left files behind"


# Each fault fires: with it off, its tests fail --------------------------------------------------


def fault_kinds():
    """The faults fault.py's docstring lists: kill, raise, cut, ..."""
    doc = ast.get_docstring(ast.parse(FAULT.read_text()))
    listed = doc[doc.index("FAULT is one of") :].split("\n\n")[0]
    return re.findall(r"^ {4}([a-z]+)\b", listed, flags=re.M)


def fault_tests():
    """{kind: the node ids of the tests that run a command with that fault}, read from the test
    modules: a command f"... {FAULT} KIND@... script.py ..." in a test function."""
    found = {}
    for module in sorted((ROOT / "tests").glob("test_*.py")):
        for function in ast.parse(module.read_text()).body:
            if not (isinstance(function, ast.FunctionDef) and function.name.startswith("test_")):
                continue
            for node in ast.walk(function):
                parts = node.values if isinstance(node, ast.JoinedStr) else []
                for part, after in zip(parts, parts[1:], strict=False):
                    if getattr(part, "value", None) and getattr(part.value, "id", None) == "FAULT":
                        kind = after.value.split()[0].partition("@")[0]
                        found.setdefault(kind, set()).add(f"tests/{module.name}::{function.name}")
    return {kind: sorted(tests) for kind, tests in found.items()}


FAULTS = fault_kinds()


def test_every_fault_has_a_test_and_every_test_a_listed_fault():
    assert sorted(fault_tests()) == sorted(FAULTS)


def with_fault_off(kind, folder):
    """Run the tests of a fault with FAULT_OFF=kind, in a pytest of their own; what each ended with."""
    tests, report = fault_tests()[kind], folder / f"{kind}.xml"
    command = [sys.executable, "-m", "pytest", *tests, "-p", "no:cacheprovider", "-o", "addopts=", "-q"]
    command += [f"--junitxml={report}", f"--basetemp={folder / kind}"]
    proc = subprocess.run(
        command, cwd=ROOT, env=dict(os.environ, FAULT_OFF=kind), capture_output=True, text=True, timeout=900
    )
    cases = ElementTree.parse(report).getroot().iter("testcase") if report.exists() else []
    # by module and name: two files may hold a test of one name (DDP's and FSDP's kill test)
    failures = {f"{case.get('classname')}::{case.get('name')}": case.find("failure") for case in cases}
    return proc, {
        name: None if failure is None else failure.get("message") for name, failure in failures.items()
    }


@pytest.fixture(scope="module")
def faults_off(request, tmp_path_factory):
    """Each selected fault's tests, run with it off, two pytests at a time."""
    folder = tmp_path_factory.mktemp("faults_off")
    pool = ThreadPoolExecutor(max_workers=2)
    cases = selected(request, test_with_its_fault_off_each_faults_test_fails_saying_it_never_fired)
    yield {case["kind"]: pool.submit(with_fault_off, case["kind"], folder) for case in cases}
    pool.shutdown(cancel_futures=True)


@pytest.mark.slow
@pytest.mark.parametrize("kind", FAULTS)
def test_with_its_fault_off_each_faults_test_fails_saying_it_never_fired(faults_off, kind):
    # a run that never met its fault may end as one that did (an uninterrupted run resumes from
    # nothing and equals the straight run): each test first asserts that its fault fired
    proc, outcomes = faults_off[kind].result()
    assert len(outcomes) >= len(fault_tests()[kind]), proc.stdout[-3000:] + proc.stderr[-3000:]
    for name, failure in outcomes.items():
        assert failure is not None, f"{name} passed with fault.py's {kind} off"
        assert f"fault.py's {kind}" in failure and "never fired" in failure, f"{name}: {failure}"
