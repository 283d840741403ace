"""check_ddp as a package a reader can walk: its layout is its architecture, and these tests hold it.

The side that runs inside the learner's processes (watch/, standin/, records.py) imports nothing of the
side that judges (judge/, rules/, report.py); each DDP step's rules are a module of their own, which
imports no other step's; the imports run in one direction, without a cycle; no module is longer than
a reader reads at once. The judge takes a job's records and returns a verdict: it writes on nothing it
is given, and judges each run of a job once."""

import ast
import copy
import json
import subprocess
import sys

import pytest
from helpers import ROOT

import check_ddp.verdict as judging
from check_ddp.job import Job, runs
from check_ddp.report import as_json, report

PACKAGE = ROOT / "check_ddp"
JOBS = ROOT / "tests" / "check_ddp_jobs"
WORKER = ("check_ddp.worker", "check_ddp.watch", "check_ddp.standin", "check_ddp.records")  # a worker's
JUDGE = ("check_ddp.judge", "check_ddp.rules", "check_ddp.report", "check_ddp.cli", "check_ddp.run")


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path):
    """The modules of the package that a module imports, by name (check_ddp.judge.facts), at any depth
    of its code: `from .x import y` and `from . import x` resolved as Python resolves them."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("check_ddp"):
                continue
            submodules = [f"{target}.{a.name}" for a in node.names]
            found |= {m for m in submodules if (ROOT / m.replace(".", "/")).with_suffix(".py").is_file()}
            found |= {m for m in submodules if (ROOT / m.replace(".", "/") / "__init__.py").is_file()}
            found.add(target)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("check_ddp")}
    return found - {name}


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}
GRAPH = {name: imports(path) for name, path in MODULES.items()}


def test_the_worker_side_imports_nothing_of_the_judge():
    """What runs inside the learner's processes names no module of the judge's, and, loaded as a
    job's worker loads it (check_ddp.worker, through check_ddp.run's sitecustomize), loads none."""
    named = {
        (name, target)
        for name, targets in GRAPH.items()
        if name.startswith(WORKER)
        for target in targets
        if target.startswith(JUDGE) or target == "check_ddp.job"
    }
    assert not named, sorted(named)
    code = "import sys, check_ddp.worker; print([m for m in sys.modules if m.startswith('check_ddp')])"
    loaded = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    assert not [m for m in json.loads(loaded.stdout.replace("'", '"')) if m.startswith(JUDGE)], loaded.stdout


def test_no_step_module_imports_another():
    """A rule of step 3 reads the facts, the source and the evidence several steps share
    (judge/evidence.py), never another step's module: each step can be read, and changed, alone."""
    steps = {name for name in GRAPH if name.startswith("check_ddp.rules.")}
    crossing = sorted((name, target) for name in steps for target in GRAPH[name] if target in steps)
    assert not crossing, crossing


def test_the_imports_run_in_one_direction_without_a_cycle():
    """No module imports, however indirectly, one that imports it: the package's parts stack up (the
    records and the watcher under the judge, the judge under the report and the command line). A
    package's __init__ counts as what importing any of its modules runs."""
    edges = {name: set(targets) for name, targets in GRAPH.items()}
    for name in MODULES:  # importing check_ddp.judge.facts runs check_ddp/judge/__init__.py first
        parent = name.rpartition(".")[0]
        if parent in MODULES and parent != "check_ddp":
            for importer, targets in edges.items():
                if name in targets and importer != parent and not importer.startswith(parent + "."):
                    targets.add(parent)
    state, cycles = {}, []

    def visit(node, path):
        state[node] = "open"
        for target in sorted(edges.get(node, ())):
            if state.get(target) == "open":
                cycles.append(path[path.index(target) :] + [target] if target in path else [node, target])
            elif target not in state:
                visit(target, [*path, target])
        state[node] = "done"

    for name in sorted(edges):
        if name not in state:
            visit(name, [name])
    assert not cycles, cycles


def test_no_module_is_longer_than_600_lines_and_no_function_than_80():
    long_modules = {
        name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 600
    }
    assert not long_modules, long_modules
    long_functions = [
        (name, node.name, node.end_lineno - node.lineno + 1)
        for name, path in MODULES.items()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80
    ]
    assert not long_functions, long_functions


def state_of(job):
    """Everything a job holds, to compare before and after judging it."""
    return copy.deepcopy({key: value for key, value in vars(job).items()})


# a job run again with what stopped it set aside (its runs: the job, then/), and one run alone
RUN_AGAIN = sorted(p.name for p in JOBS.iterdir() if (p / "then").is_dir())[0]


@pytest.mark.parametrize("case", [RUN_AGAIN, "mnist_ok"])
def test_the_judge_writes_on_nothing_it_is_given_and_judges_each_run_once(case, monkeypatch):
    """judge() reads a job and returns a verdict: the job, and each run of it again, hold after judging
    what they held before; each run is judged once, and the report and its JSON judge nothing again."""
    job = Job.load(JOBS / case)
    chain = runs(job)
    before = state_of(job)
    judged = []
    judge_run = judging.judge_run
    monkeypatch.setattr(judging, "judge_run", lambda run: judged.append(run.folder) or judge_run(run))
    verdict = judging.judge(job)
    assert judged == [run.folder for run in chain]
    report(job, verdict)
    as_json(job, verdict)
    assert len(judged) == len(chain), "the report judged a run again"
    assert state_of(job) == before
    again = judging.judge(job, {run.folder: found for run, found in zip(chain, verdict.runs, strict=True)})
    assert len(judged) == len(chain) and again == verdict  # runs judged already are not judged again
