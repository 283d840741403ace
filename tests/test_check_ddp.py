"""check_ddp.py, tried on other people's code: scripts in tests/check_ddp_cases/ written in styles
not ours, the correct ones passing and each with one classic mistake failing at its step; and on
our own train_ddp.py, a hang, a crash, a missing file.

Each case states what the checker must say, on a line near its top:

    # check_ddp: exit 1, FAIL step 3, see 03
    # check_ddp: exit 0, warn step 7

(`see NN`: the FAIL or warn line names pitfalls/NN_*.py; `gpu: ...` after it: what a GPU machine
says instead), and the line the report must name, if any, ends with `# check_ddp: here`.
"""

import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from helpers import ROOT, copy_scripts, cpu_env, run, selected

CHECK = ROOT / "check_ddp.py"
CASES = sorted((ROOT / "tests" / "check_ddp_cases").glob("*.py"))
STEP_LINE = re.compile(r"^step (\d+) +(ok|warn|FAIL|--) +(.*)$")


def check(script, *args, cwd, expect, silence=8, env=None):
    """python check_ddp.py ... as a user would run it; its report, step by step."""
    command = [sys.executable, str(CHECK), "--silence", str(silence), script, *args]
    proc = run(command, cwd=cwd, env=env, expect=expect, timeout=150)
    steps, current = {}, None
    for line in proc.stdout.splitlines():
        found = STEP_LINE.match(line)
        if found:
            current = int(found.group(1))
            steps[current] = [found.group(2), found.group(3)]
        elif current is not None and line.startswith(" "):
            steps[current][1] += "\n" + line.strip()
    assert proc.stdout.splitlines()[-1].startswith("check_ddp: "), proc.stdout
    return proc, {step: (verdict, text) for step, (verdict, text) in steps.items()}


def expectation(path):
    """(exit status, {step: verdict}, the pitfall numbers named, the line marked `here`)."""
    text = path.read_text()
    line = re.search(r"^# check_ddp: (.*)$", text, re.M)
    assert line, f"{path.name} states no expectation"
    cpu, _, gpu = line.group(1).partition(", gpu:")
    spec = gpu if torch.cuda.is_available() and gpu else cpu
    status = int(re.search(r"exit (\d)", cpu).group(1))
    if gpu and torch.cuda.is_available():
        status = 1 if "FAIL" in gpu else 0
    verdicts = {int(step): verdict for verdict, step in re.findall(r"(FAIL|warn|ok) step (\d+)", spec)}
    see = re.findall(r"see (\d\d)", spec)
    marked = [
        n for n, source in enumerate(text.splitlines(), 1) if source.rstrip().endswith("# check_ddp: here")
    ]
    return status, verdicts, see, marked


@pytest.fixture(scope="module")
def reports(request, tmp_path_factory):
    """Every case this session tests checked once, each in a folder of its own, three at a time:
    much of a check is waiting (torchrun's start-up, a hang's --silence), which the others fill.
    The fixture hands out each check's future; a test waits for its own."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {}
        for case in (
            params["case"] for params in selected(request, test_check_ddp_on_a_script_in_another_style)
        ):
            folder = tmp_path_factory.mktemp(case.stem)
            shutil.copy(case, folder / case.name)
            futures[case.stem] = pool.submit(check, case.name, cwd=folder, expect=None)
        yield futures


# the quick tier (not slow) checks one case: the README's mistake, in another style than ours
QUICK = "mnist_no_set_epoch"


@pytest.mark.parametrize(
    "case",
    [case if case.stem == QUICK else pytest.param(case, marks=pytest.mark.slow) for case in CASES],
    ids=[case.stem for case in CASES],
)
def test_check_ddp_on_a_script_in_another_style(reports, case):
    status, verdicts, see, marked = expectation(case)
    proc, steps = reports[case.stem].result()
    assert proc.returncode == status, f"exit {proc.returncode}, expected {status}\n{proc.stdout}"
    assert set(range(1, 9)) <= steps.keys(), proc.stdout  # every step of the guide has its line
    for step, verdict in verdicts.items():
        assert steps[step][0] == verdict, f"step {step}: expected {verdict}\n{proc.stdout}"
    unexpected = [s for s, (v, _) in steps.items() if v == "FAIL" and verdicts.get(s) != "FAIL"]
    assert not unexpected, f"false alarms on steps {unexpected}\n{proc.stdout}"
    flagged = "\n".join(text for verdict, text in steps.values() if verdict in ("FAIL", "warn"))
    for number in see:
        assert f"see:  pitfalls/{number}_" in flagged, f"pitfall {number} not named\n{proc.stdout}"
    for line in marked if "FAIL" in verdicts.values() or "warn" in verdicts.values() else ():
        assert f"{case.name}:{line}" in flagged, f"{case.name}:{line} not named\n{proc.stdout}"


def test_check_ddp_passes_our_train_ddp(tmp_path):
    work = copy_scripts(tmp_path)
    proc, steps = check("train_ddp.py", "--epochs", "2", "--grad_accum_steps", "2", cwd=work, expect=0)
    assert {step: verdict for step, (verdict, _) in steps.items() if verdict != "ok"} == {2: "--"}, (
        proc.stdout
    )
    assert steps[9][0] == "ok"  # the script accumulates, with no_sync
    assert (work / "out/train_ddp/run_1/model_epoch_2.pt").exists()  # the job ran for real


def test_a_missing_script_is_a_usage_error(tmp_path):
    proc = run([sys.executable, str(CHECK), "no_such_script.py"], cwd=tmp_path, env=cpu_env(), expect=2)
    assert "no_such_script.py: no such file" in proc.stderr
