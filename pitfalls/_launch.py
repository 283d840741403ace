"""Plumbing shared by the pitfalls: start a job with torchrun, read what it said, report.

Not a pitfall itself; each pitfalls/stepN_*.py and fsdp_stepN_*.py imports it. The lesson
stays in those files.
"""

import json
import re
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

# the timeout every pitfall gives its process group: a hang shows as this timeout's message
TIMEOUT_S = 3

# what a rank of a hung job says when it gives up: its own timeout, or that the rank which gave up
# first went, which gloo words two ways ("Connection closed by peer", "Application timeout caused
# pair closure"); a pitfall reads it after the rank's prefix, rf"^\[rank{r}\]: {GAVE_UP}"
GAVE_UP = r"\w+Error: .*(Timed out|closed by peer|pair closure)"


def torchrun(script, *args, nproc=2, options=("--standalone",), env=None, timeout=60):
    """Run `torchrun OPTIONS --nproc_per_node=NPROC SCRIPT ARGS` with this Python, as a user would
    type it, and capture what it says: stdout, stderr, returncode, seconds (as run() does).

    torchrun stops every worker once one has failed. It looks each second here, not each 0.1 s as by
    default, so that in a mistake whose ranks fail one after the other, the rank that fails second
    has the time to say why (on a busy machine, one was stopped before it could)."""
    command = [sys.executable, "-m", "torch.distributed.run", "--monitor-interval=1", *options]
    command.append(f"--nproc_per_node={nproc}")
    return run([*command, script, *args], env=env, timeout=timeout)


def run(command, env=None, cwd=None, timeout=60):
    """Run command (a list) and capture what it says: stdout, stderr, returncode, seconds.

    Nothing here may hang for real: a command still running after `timeout` seconds is stopped
    (torchrun, told to, stops its workers), and ends the pitfall with exit 1."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: torchrun stops its workers, then itself
        try:
            stdout, stderr = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = "", ""
        print(f"NOT as documented: a job still ran after {timeout} s, and was stopped")
        print(f"--- stdout\n{stdout[-3000:]}\n--- stderr\n{stderr[-3000:]}")
        sys.exit(1)
    return SimpleNamespace(
        stdout=stdout, stderr=stderr, returncode=proc.returncode, seconds=time.perf_counter() - start
    )


def error_line(text, pattern=r"^\w[\w.]*(Error|Exception): "):
    """The first line of text that matches pattern: by default, the line that names a raised error."""
    line = next((line for line in text.splitlines() if re.search(pattern, line)), "")
    return re.sub(r"\x1b\[[0-9;]*m", "", line).strip()  # without terminal colour codes


def exit_codes(job):
    """{rank: exit code} of the workers torchrun's report lists as failed. A negative code is the
    signal that ended the worker: -6 (SIGABRT) is an abort in C++ code, with no Python traceback;
    -15 (SIGTERM) is torchrun stopping a worker once another has failed."""
    found = re.findall(r"rank\s*: (\d+) \(local_rank: \d+\)\n\s*exitcode\s*: (-?\d+)", job.stderr)
    return {int(rank): int(code) for rank, code in found}


def free_port(preferred=0):
    """preferred if no process on this machine holds it now, else a port that none does."""
    for port in (preferred, 0):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return s.getsockname()[1]


def tell(**values):
    """In a worker: report values to the parent, as one line written at once (lines from
    several processes share one pipe, and must not interleave)."""
    sys.stdout.write(f"RESULT {json.dumps(values)}\n")
    sys.stdout.flush()


def told(job):
    """In the parent: what the workers of a job reported with tell(), a list of dicts."""
    return [json.loads(line[7:]) for line in job.stdout.splitlines() if line.startswith("RESULT ")]


def results(job):
    """told(job), of a job that must have run: one that failed instead, or reported nothing,
    is shown, and ends the pitfall with exit 1."""
    if job.returncode != 0 or not told(job):
        print(f"NOT as documented: a job that should run exited {job.returncode}")
        print(f"--- stdout\n{job.stdout[-3000:]}\n--- stderr\n{job.stderr[-3000:]}")
        sys.exit(1)
    return told(job)


def report(mistake, symptom, fix, result, checks, runs=()):
    """Print the four parts of a pitfall; exit 0 if every check held, else say which failed and exit 1."""
    for label, text in (("mistake", mistake), ("symptom", symptom), ("fix", fix), ("result", result)):
        print(f"{label + ':':9}" + f"\n{'':9}".join(text.splitlines()))
    failed = [name for name, held in checks.items() if not held]
    if not failed:
        print("as documented")
        sys.exit(0)
    print("NOT as documented: " + "; ".join(failed))
    for job in runs:  # what the jobs said, to see why
        print(f"--- exit {job.returncode}, stdout\n{job.stdout[-3000:]}\n--- stderr\n{job.stderr[-3000:]}")
    sys.exit(1)
