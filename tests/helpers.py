"""Plumbing shared by the tests: run the real entry points, read what they wrote."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
# the twins: the baseline, its DDP conversion, and the DDP twin's own twin, with FSDP2 (docs/fsdp.md)
SCRIPTS = ("single_gpu_baseline.py", "train_ddp.py", "train_fsdp.py")
# torchrun, as the interpreter running the tests runs it: never another torch's torchrun on PATH
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
# runs a script with one injected fault (its docstring lists them)
FAULT = ROOT / "tests" / "fault.py"


# The runs the proofs compare, written once for every module that makes them, so that the same run
# is the same command, made once a session (conftest.py, shared_run). 2048 = 64 x 32: every N here
# divides each batch of 64; 499 held-out samples: none divides those, so that DDP's evaluation
# shards differ in size, as they do in real jobs.
PROOF_FLAGS = {"epochs": 4, "dataset_size": 2048, "val_size": 499}


def as_flags(**values):
    return " ".join(f"--{name} {value}" for name, value in values.items())


def baseline_run(**values):
    """The baseline's command for a proof, at batch 64 and PROOF_FLAGS unless values say otherwise."""
    return "python single_gpu_baseline.py " + as_flags(**{"batch_size": 64, **PROOF_FLAGS, **values})


def ddp_run(nproc, **values):
    """train_ddp.py's command for a proof: nproc processes at batch 64/nproc each (the baseline's
    global batch) and PROOF_FLAGS, unless values say otherwise."""
    launcher = f"torchrun --standalone --nproc_per_node={nproc} train_ddp.py "
    return launcher + as_flags(**{"batch_size": 64 // nproc, **PROOF_FLAGS, **values})


def fsdp_run(nproc, **values):
    """train_fsdp.py's command for a proof, as ddp_run's: nproc processes at batch 64/nproc each."""
    return ddp_run(nproc, **values).replace("train_ddp.py", "train_fsdp.py")


# A small job that saves every epoch (4 optimizer steps an epoch on each of its 2 ranks), run
# straight through: what the fault tests and the crash proofs break, restart and resume, and
# what they must end equal to.
SMALL = "--dataset_size 512 --val_size 64 --save_interval 1"
STRAIGHT = f"torchrun --standalone --nproc_per_node=2 train_ddp.py --epochs 4 {SMALL} --out_dir straight"


def notebook_exercise():
    """The script of the notebook's Your turn, as its %%writefile cell saves it: an ordinary training
    script for one device, for the learner to convert."""
    cells = json.loads((ROOT / "walkthrough.ipynb").read_text())["cells"]
    (cell,) = ["".join(c["source"]) for c in cells if "".join(c["source"]).startswith("%%writefile")]
    return cell.partition("\n")[2] + "\n"


def readme_conversion(script):
    """The README's conversion (its diff, under "Convert your own script") applied to script, as a
    learner who follows it would: each line the diff keeps or removes is found in script, in order
    (the diff's `...` stands for the lines up to the next one it names), and each line it adds is
    put in its place. A line not found fails: the README's conversion no longer fits the script."""
    readme = (ROOT / "README.md").read_text()
    diff = re.search(r"^## Convert your own script\n.*?```diff\n(.*?)```", readme, re.S | re.M).group(1)
    lines, out, added, at, skip = script.splitlines(), [], [], 0, True  # before the first: the header
    for line in diff.splitlines():
        kind, code = line[:1], line[1:]
        if kind == "+":
            added.append(code)
            continue
        code = re.sub(r"\s{2,}# .*$", "", code)  # the README's comment on the line, not the script's
        if code.strip() == "...":
            skip = True
            continue
        found = next((i for i in range(at, len(lines)) if lines[i] == code), None)
        assert found is not None and (skip or found == at), (
            f"the README's conversion: not in the script: {code!r}"
        )
        out += lines[at:found] + added + ([code] if kind == " " else [])
        added, at, skip = [], found + 1, False
    return "\n".join(out + lines[at:] + added) + "\n"


def copy_scripts(dest):
    """Copy the twin scripts (SCRIPTS) into dest, so that a user's command runs there verbatim."""
    for name in SCRIPTS:
        shutil.copy(ROOT / name, dest / name)
    return dest


def cpu_env(**extra):
    """The environment of every process these tests start: pinned to the CPU, whatever the
    machine has, so that the suite runs the same on a GPU machine as on CI (tests/test_gpu.py
    is the set that uses GPUs); one thread each, as torchrun gives its workers and the notebook
    every run: a second thread only spins on a small model, and on 2 cores it takes the CPU from
    the runs beside it (a baseline run costs twice the CPU time with it)."""
    return {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", **extra}


def run(command, cwd, timeout=180, env=None, expect=0):
    """Run a command as a user would type it, on the CPU unless env says otherwise; fail with
    its output if it exits otherwise than expected."""
    env = cpu_env() if env is None else env
    argv = command.split() if isinstance(command, str) else list(command)
    if argv[0] == "python":
        argv[0] = sys.executable
    elif argv[0] == "torchrun":
        argv[:1] = TORCHRUN
    with subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as job:
        try:
            stdout, stderr = job.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            stdout = stderr = ""
            # SIGTERM first, to the whole session: torchrun then stops its workers, which SIGKILL
            # to torchrun alone would leave running (on a GPU, holding it)
            for sig in (signal.SIGTERM, signal.SIGKILL):
                os.killpg(job.pid, sig)
                try:
                    stdout, stderr = job.communicate(timeout=15)
                    break
                except subprocess.TimeoutExpired:
                    continue
            raise AssertionError(
                f"{command!r} ran past {timeout} s\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
            ) from None
    proc = subprocess.CompletedProcess(argv, job.returncode, stdout, stderr)
    if expect is not None and proc.returncode != expect:
        raise AssertionError(
            f"{command!r} exited {proc.returncode}, expected {expect}\n"
            f"--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}"
        )
    return proc


def run_at_once(commands, cwd, env=None, expect=0, timeout=180):
    """Start the commands together, and wait for them all: run() of each, in a thread of its own
    (so that a command past its time is stopped, torchrun's workers too, and shown)."""
    with ThreadPoolExecutor(max_workers=len(commands)) as pool:
        jobs = [pool.submit(run, command, cwd, timeout, env, expect) for command in commands]
        return [job.result() for job in jobs]


def selected(request, test):
    """The cases of test, a test function, that this session runs (after -k, -m and the like):
    each one's parameters, in the order they run."""
    return [item.callspec.params for item in request.session.items if getattr(item, "function", None) is test]


def assert_fired(stderr, fault):
    """The run met its fault: fault.py said that it fired (a run without it may end the same)."""
    assert f"fault.py: {fault} fired: " in stderr, f"fault.py's {fault} never fired:\n{stderr[-3000:]}"


def assert_failed(stderr, killed):
    """torchrun saw its worker group fail (and, given --max-restarts, restarted it): the rank killed
    (exit code -9, SIGKILL), or first its peer, which gloo aborts as the connection drops (-6,
    SIGABRT), whichever torchrun polls first (the peer's, once in a kept run here)."""
    by_kill = f"failed (exitcode: -9) local_rank: {killed}" in stderr
    by_peer = re.search(r"failed \(exitcode: -6\) local_rank: \d", stderr)
    assert by_kill or by_peer, f"torchrun saw no worker fail:\n{stderr[-3000:]}"


def read_metrics(out_dir):
    lines = (Path(out_dir) / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def load_checkpoint(path):
    return torch.load(path, map_location="cpu", weights_only=True)


def max_weight_diff(a, b):
    a, b = a["model_state_dict"], b["model_state_dict"]
    assert a.keys() == b.keys()
    return max((a[k] - b[k]).abs().max().item() for k in a)


# Reports every file write under the test's folder, with the rank that made it, to
# stderr: an audit hook installed in each worker through sitecustomize.
AUDIT_HOOK = """
import os, sys
ROOT = os.environ["AUDIT_ROOT"]
def hook(event, args):
    if event == "open" and isinstance(args[0], str) and args[1] and set(args[1]) & set("wax+"):
        path = args[0]
    elif event in ("os.rename", "os.mkdir", "os.remove"):
        path = os.fsdecode(args[1] if event == "os.rename" else args[0])
    else:
        return
    if os.path.abspath(path).startswith(ROOT):
        sys.stderr.write(f"AUDIT rank={os.environ.get('RANK')} {event} {path}\\n")
sys.addaudithook(hook)
"""


def audit_env(tmp_path, watch):
    """An environment in which every Python process reports its writes under watch."""
    (tmp_path / "hook").mkdir(exist_ok=True)
    (tmp_path / "hook/sitecustomize.py").write_text(AUDIT_HOOK)
    return cpu_env(PYTHONPATH=str(tmp_path / "hook"), AUDIT_ROOT=str(watch))
