"""benchmarks/gpu_checks.sh, run as a freshly lent GPU machine runs it, on any machine: in a copy
of the files that travel there (no .venv), with a python3 on PATH that has torch, pytest and
matplotlib but none of the notebook's packages, and a torch that is not the pinned one. Every
process is pinned to the CPU, so it must get as far as "no GPU", cleanly, with the environment
written and the GPU tests collected. benchmarks/README.md has the same by hand."""

import subprocess
import sys

import pytest
import torch
from helpers import ROOT, cpu_env

# a sitecustomize for the GPU machine's Python, after a line HIDDEN = (names): what it lacks
# cannot be imported
HIDE = """
import sys

class Hide:
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0].startswith(HIDDEN):
            raise ModuleNotFoundError(f"No module named {name!r} (hidden, as on the GPU machine)", name=name)

sys.meta_path.insert(0, Hide())
"""
NOTEBOOK_PACKAGES = ("nbformat", "nbclient", "nbconvert", "ipykernel", "IPython", "jupyter")
NOT_PINNED = "0.0.0"  # the torch version the copy's requirements.txt pins: not the one here
IGNORED = {".git", ".venv", "out", "__pycache__", ".pytest_cache", ".ruff_cache", ".ipynb_checkpoints"}


def travelling_files():
    """What a GPU machine receives: the tracked files, and the untracked ones git does not ignore.
    Outside a git checkout (a GPU machine's copy may be one), every file but the IGNORED folders."""
    try:
        listed = subprocess.run(
            ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            cwd=ROOT,
            capture_output=True,
            check=True,
        ).stdout.decode()
        return [ROOT / name for name in listed.split("\0") if name]
    except (OSError, subprocess.CalledProcessError):
        return [p for p in ROOT.rglob("*") if not IGNORED & set(p.relative_to(ROOT).parts)]


def fresh_copy(dest):
    for path in travelling_files():
        if path.is_file():  # not a file deleted since its last commit
            (dest / path.relative_to(ROOT)).parent.mkdir(parents=True, exist_ok=True)
            (dest / path.relative_to(ROOT)).write_bytes(path.read_bytes())
    pins = (dest / "requirements.txt").read_text()
    (dest / "requirements.txt").write_text(pins.replace(f"torch=={pinned(pins)}", f"torch=={NOT_PINNED}"))
    return dest


def pinned(requirements):
    return next(line.split("==")[1] for line in requirements.splitlines() if line.startswith("torch=="))


def python3_without(folder, hidden):
    """A folder for PATH whose python3 is this interpreter, with the hidden packages unimportable
    in it and in every process it starts."""
    (folder / "site").mkdir(parents=True)
    (folder / "site/sitecustomize.py").write_text(f"HIDDEN = {tuple(hidden)!r}\n{HIDE}")
    (folder / "bin").mkdir()
    shim = folder / "bin/python3"
    shim.write_text(f'#!/bin/sh\nPYTHONPATH="{folder / "site"}" exec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)
    return folder / "bin"


def gpu_checks(tmp_path, hidden):
    """Run gpu_checks.sh in a fresh copy, with that python3 first on PATH and OUT set."""
    copy = fresh_copy(tmp_path / "copy")
    assert not (copy / ".venv").exists()
    path = f"{python3_without(tmp_path / 'python3', hidden)}:{cpu_env()['PATH']}"
    env = cpu_env(PATH=path, OUT=str(tmp_path / "out"))
    env.pop("PYTHON", None)
    proc = subprocess.run(
        ["bash", "benchmarks/gpu_checks.sh"], cwd=copy, env=env, capture_output=True, text=True, timeout=180
    )
    return proc, tmp_path / "out"


@pytest.mark.slow
def test_without_a_gpu_it_stops_plainly_with_its_environment_written_and_the_gpu_tests_collected(tmp_path):
    proc, out = gpu_checks(tmp_path, hidden=NOTEBOOK_PACKAGES)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    said = proc.stderr
    assert f"torch {torch.__version__} is not the {NOT_PINNED} that requirements.txt pins: going on" in said
    assert "gpu_checks.sh: stopped: no GPU here" in said, said

    environment = (out / "environment.txt").read_text()
    assert f"torch: {torch.__version__}" in environment, environment
    assert "gpus: 0" in environment and "nbformat missing" in environment, environment
    assert "$ nvidia-smi" in environment

    # what python3 -m pytest -m gpu --collect-only printed, in that Python
    collected = (out / "gpu_tests_collected.txt").read_text()
    lines = collected.splitlines()
    assert "tests collected" in lines[-1] and "error" not in lines[-1], collected
    assert not [line for line in lines if line.startswith("ERROR")], collected
    gpu_tests = [line for line in lines if line.startswith("tests/test_gpu.py::")]
    assert len(gpu_tests) >= 10, collected
    assert "tests/test_proofs.py::test_more_processes_than_gpus_is_refused" in collected
    assert "tests/test_twins.py" not in collected  # -m gpu: the CPU tests are left out
    assert not (out / "gpu_tests.txt").exists()  # nothing ran on a GPU


def test_a_python_without_torch_is_refused_by_name(tmp_path):
    proc, out = gpu_checks(tmp_path, hidden=("torch",))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "gpu_checks.sh: stopped: python3 cannot import torch" in proc.stderr, proc.stderr
    assert "torch: cannot be imported" in (out / "environment.txt").read_text()
    assert not (out / "gpu_tests_collected.txt").exists()


def test_its_hang_on_nccl_needs_two_gpus_and_says_so_where_there_are_fewer():
    # gpu_checks.sh's stage 8 runs it where there are 2 GPUs; on fewer it must end at once, saying why
    proc = subprocess.run(
        [sys.executable, "benchmarks/hang_tools.py", "--backend", "nccl"],
        cwd=ROOT,
        env=cpu_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert (
        "hang_tools: nccl puts each rank on a GPU of its own: 2 are needed, 0 here; nothing ran"
        in proc.stderr
    )
    stage = (ROOT / "benchmarks/gpu_checks.sh").read_text().split("# 8. ")[1]
    assert '"$gpus" -ge 2' in stage and "hang_tools.py --backend nccl" in stage
