"""At the end: what no step's line accounts for (AT_THE_END), at the step it names: a crash, then a
job the check had to stop."""

from ..judge.crash import crash_phase, crash_step, needs_gpu
from ..judge.evidence import out_of_step, where_each_waits
from ..judge.registry import Found, rule
from ..judge.words import inner_place, short
from ..steps import STEPS


@rule(
    "DDP000",
    "FAIL",
    explains=("crash",),
    help="the script's own error, not a DDP step's: torchrun then stopped every rank. Its traceback is in "
    "the job's output (the report's last line says where)",
)
def crashed(f):
    """The script stopped with an error of its own.

    A rank raised an error that none of the other findings explains; torchrun then stopped every
    rank. The report puts it where the call that raised it belongs: under its DDP step, where that
    call is a DDP call (a DataLoader made with both a sampler and shuffle=True: DDP step 3; a
    checkpoint that does not load: DDP step 6; a collective, the step that uses it: a broadcast made
    while resuming, DDP step 6), after that step's own finding where it has one (the cause, which
    the error followed); else on a line of its own, the script's, where the
    script's own code raised it (a bug of its own, a library's error, a file it cannot find), whatever
    step the job was in. What one process shows too is the script's own: an error while a DataLoader
    gives batches (a dataset's, a worker's, the collation's: a sampler only picks the indices), a
    DataLoader made with no sampler (the single-process script makes the same one). The job's output
    has the whole traceback. An error that is not the script's is not checked (--): one that needs a
    GPU the stand-in cannot give (CUDA's own generator, a CUDA extension), a program the script runs
    that the machine lacks, or one of check_ddp's own code.
    """
    if f.crash is None or "crash" in f.explained:
        return None
    rank, event = f.crash
    step = crash_step(f, rank, event)
    error = short(event["message"])  # a worker's error carries its own type: said once
    error = error if error.startswith(f"{event['type']}: ") else f"{event['type']}: {error}"
    at = inner_place(event["message"], f.job) or event["at"]
    first_unjudged = next((s for s in STEPS if s not in {x.step for x in f.lines if x.verdict != "--"}), 8)
    if event["raised"] == "checker" and rank not in f.refused:  # this file's own error: never the script's
        return Found(
            f"not checked: check_ddp's own error stopped the job here, at {f.code(event['at'])}: {error}",
            step=step or first_unjudged,
            verdict="--",
        )
    if event["program"]:  # a program this machine lacks: the machine's, not the script's
        return Found(
            f"not checked: the job stopped where the script runs {event['program']}, which this machine "
            f"lacks, at {f.code(at)}",
            step=step or first_unjudged,
            verdict="--",
        )
    if f.standin and needs_gpu(f, rank, event):  # what the stand-in cannot run: a step not judged
        judged = {x.step for x in f.lines if x.verdict != "--"}
        step = next((s for s in STEPS if (step or 1) <= s <= 8 and s not in judged), step or first_unjudged)
        return Found(
            f"not checked: the job stopped where it needs a GPU, at {f.code(event['at'])}: {error}",
            step=step,
            verdict="--",
        )
    doing = crash_phase(f, rank)[0]
    if 'Unexpected key(s) in state_dict: "module.' in event["message"]:  # a wrapper's file, read bare
        error = error.rstrip(".") + (
            "; the file's keys start with module., the DDP wrapper's: save model.module.state_dict() (DDP603)"
        )
    # a DDP call's error (a checkpoint that does not load: step 6) is its step's; else the script's own
    helped = (
        None
        if not step  # the script's own line (SCRIPT), or no step
        else (
            f"fix the DDP step {step} call that raised it (the line above): torchrun then stopped every "
            "rank. Its traceback is in the job's output (the report's last line says where)"
        )
    )
    return Found(
        f"rank {rank} stopped with an error {doing}, at {f.code(at)}: {error}", step=step, help=helped
    )


@rule(
    "DDP504",
    "FAIL",
    hang=True,
    across=True,
    see="rank_zero_collective",
    help="every rank must reach the same collectives, in the same order",
)
def stopped_making_progress(f):
    """The job stopped making progress after its ranks met, for a reason the records do not show.

    The report names where each rank waits. Most often a rank waits in a collective that another
    rank never reaches, or reaches in a different order. A job the check had to stop is never a
    pass: where no other line says why it stopped, this one does, under DDP step 5.
    """
    found = out_of_step(f, None)
    if found is not None:
        found.step = 5
        return found
    # a job stuck at its exit, every rank done, is step 7's (DDP701), whatever its verdict there
    if f.job.hung and not any(line.verdict == "FAIL" for line in f.lines):
        return Found(f"the check stopped the job: {where_each_waits(f)}", step=5)
    return None
