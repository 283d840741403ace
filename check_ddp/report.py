"""4. report: a line per step, details only where they help, the verdict last; or the same as JSON, for
editors and CI."""

import os
import re
import textwrap
from pathlib import Path

from .job import runs
from .judge.registry import RULES, SET_ASIDE
from .judge.words import plural
from .steps import PITFALLS, STEPS


def from_here(path):
    """A path as the reader types it from where they are: relative below their folder, else whole."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else str(path)


# the project check_ddp comes from: its pitfalls, and check_ddp.py, the command the pages give (where the
# package is installed alone, without the project, neither is there)
PROJECT = Path(__file__).resolve().parent.parent


def pitfall_path(key):
    """Where the pitfall program is, in the project beside the package, as the reader finds it from
    here; None where the package is installed alone."""
    path = PROJECT / PITFALLS[key]
    return from_here(path) if path.is_file() else None


def explain_command(code=""):
    """The command that explains a finding, as the reader types it from where they are: the project
    may be elsewhere (python ../tools/check_ddp.py my_train.py), or the package installed alone
    (check-ddp, the command pip made)."""
    script = PROJECT / "check_ddp.py"
    command = f"python {from_here(script)}" if script.is_file() else "check-ddp"
    return f"{command} --explain {code}".rstrip()


def see(line):
    """Where to read more about a finding: its pitfall, if it is here, and its explanation."""
    explanation = explain_command(line.code)
    pitfall = pitfall_path(line.see) if line.see else None
    return f"{pitfall}; {explanation}" if pitfall else explanation


# the page that shows each of PyTorch's own tools on a hang, from kept runs
HANG_TOOLS = "docs/troubleshooting.md"


def tools(job, line):
    """Which of PyTorch's own tools show a hang on the learner's cluster, as commands for their own job;
    None for a finding of no hang."""
    rule = RULES.get(line.code)
    if not rule or not rule.hang or line.verdict != "FAIL":
        return None
    page = PROJECT / HANG_TOOLS
    where = f"{from_here(page)}#a-hang-seen-with-pytorchs-own-tools" if page.is_file() else "PyTorch's docs"
    return (
        "on a cluster, start torchrun with TORCH_DISTRIBUTED_DEBUG=DETAIL (which collective differs, nccl), "
        "or with TORCH_FR_BUFFER_SIZE=2000 TORCH_FR_DUMP_TEMP_FILE=$PWD/fr/rank_ and read the dumps with "
        "python -m torch.distributed.flight_recorder.fr_trace fr (where each rank was); "
        f"dist.monitored_barrier(wait_all_ranks=True) names the rank that never came (gloo): {where}"
    )


def how_it_ran(job):
    """2 processes as 2 nodes of 1, GPU script stood in on the CPU: cuda -> cpu, nccl -> gloo."""
    n = len(job.ranks) or job.nproc
    processes = plural(n, "process")
    if job.nnodes > 1 or job.then is None and job.folder.name == "one_node":
        processes += f" as {plural(job.nnodes, 'node')} of {n // job.nnodes}"
    if job.device == "cuda":
        return f"{processes}, GPUs"
    asked = job.records("gpu") or any("nccl" in e["backend"].lower() for _, e in job.records("init"))
    return f"{processes}, " + (
        "GPU script stood in on the CPU: cuda -> cpu, nccl -> gloo" if asked else "CPU"
    )


def as_json(job, verdict):
    """The report as data: what ran, and a finding per DDP step (and the script's own error, step null),
    as the text report has them; the findings silenced, and the silencing comments that name no code."""
    findings = [
        {
            "step": line.step or None,
            "name": step_name(line.step),
            "verdict": line.verdict,
            "code": line.code,
            "message": line.message,
            "at": re.findall(r"[\w./-]+\.py:\d+", line.message),
            "help": line.help if line.verdict in ("FAIL", "warn") else None,
            "see": see(line) if line.verdict in ("FAIL", "warn") else None,
            "tools": tools(job, line),
            "run": line.run,
        }
        for line in verdict.lines
    ]
    return {
        "command": job.command,
        "how": how_it_ran(job),
        "seconds": round(job.seconds, 1),
        "exit": verdict.status,
        # the job, then each run of it again, with what it set aside: a finding's "run" is its index
        "runs": [
            {"how": how_it_ran(run), "set_aside": list(run.aside), "seconds": round(run.seconds, 1)}
            for run in runs(job)
        ],
        "findings": findings,
        "ignored": [{"code": code, "at": at, "step": step} for code, at, step in verdict.ignored],
        "unknown_ignores": [{"at": at, "code": code} for at, code in verdict.unknown_ignores],
        "own_errors": list(verdict.own_errors),
        "output": str(job.folder / "output.log"),
    }


def step_name(step):
    return STEPS.get(step, "the script's own error")


def report(job, verdict):
    width = 100
    out = [f"check_ddp: {' '.join(job.command)}  ({how_it_ran(job)}; {job.seconds:.1f} s)"]
    for before, again in zip(verdict.runs[:-1], runs(job)[1:], strict=True):
        stops = before.stoppers
        what = " and ".join(SET_ASIDE[kind] for kind in sorted(again.aside, key=list(SET_ASIDE).index))
        steps = ", ".join(str(line.step) for line in stops)
        said = "failed" if any(line.verdict == "FAIL" for line in stops) else "warned"
        out.append(
            f"check_ddp: DDP step {steps} {said}, so checked again {what} ({how_it_ran(again)}; "
            f"{again.seconds:.1f} s): DDP step {steps} from the run before, the other steps from this one"
        )
    lines = verdict.lines
    for line in lines:
        name = f"DDP step {line.step:<2}" if line.step else "the script"
        head = f"{name:<11} {line.verdict:<5} "
        indent = " " * len(head)
        out.append(
            textwrap.fill(
                f"{step_name(line.step)}: {line.message}",
                width,
                initial_indent=head,
                subsequent_indent=indent,
            )
        )
        if line.verdict in ("FAIL", "warn"):
            out.append(
                textwrap.fill(
                    line.help, width, initial_indent=indent + "help: ", subsequent_indent=indent + " " * 6
                )
            )
            out.append(f"{indent}see:  {see(line)}")  # whole, to copy
            if tools(job, line):
                out.append(
                    textwrap.fill(
                        tools(job, line),
                        width,
                        initial_indent=indent + "tools: ",
                        subsequent_indent=indent + " " * 7,
                        break_on_hyphens=False,
                        break_long_words=False,
                    )
                )
    out += [
        f"check_ddp: {at}: ignore[{code}] names no code of check_ddp's ({explain_command()} lists them)"
        for at, code in verdict.unknown_ignores
    ]
    own = verdict.own_errors
    out += [f"check_ddp: {text}" for text in own]
    failed = [line.step for line in lines if line.verdict == "FAIL" and line.step]
    warned = [line.step for line in lines if line.verdict == "warn"]
    said = "FAIL: DDP step " + ", ".join(map(str, failed)) + " failed" if failed else "ok: no DDP step failed"
    if any(line.verdict == "FAIL" and not line.step for line in lines):
        said = (said + ", and" if failed else "FAIL:") + " the script stopped with its own error"
    if warned:
        said += f" ({plural(len(warned), 'warning')}: DDP step " + ", ".join(map(str, warned)) + ")"
    if verdict.ignored:
        said += f"; {plural(len(verdict.ignored), 'finding')} ignored as the script asks: " + ", ".join(
            f"{code} at {at}" for code, at, _ in verdict.ignored
        )
    if own:
        said += "; the check is incomplete: check_ddp's own error, above, is not your script's"
    if any(line.verdict == "--" for line in lines):
        said += ". --: not checked (the job did not show it, or it follows from another step)"
    out.append(f"check_ddp: {said}. The job's own output: {job.folder / 'output.log'}")
    return "\n".join(out)
