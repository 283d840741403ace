"""DDP step 7: clean up.

Its rules, in the order they are tried (ORDER), and its summary. A rule's docstring is its
explanation (python check_ddp.py --explain CODE): its first line the summary; then what happens,
why, and what to do."""

from ..judge.registry import Found, rule, summary
from ..judge.words import ranks_text


@rule(
    "DDP701",
    "FAIL",
    help="on gloo, torch 2.13 can hang as a process frees its DDP model (pytorch/pytorch#190489); else "
    "something still runs as Python exits (a thread, a worker pool): end it",
)
def stuck_at_exit(f):
    """Every rank finished its script, but a process did not end: the job never ends by itself.

    Something still ran as Python exited: a thread that is not a daemon, a worker pool never
    closed, or, on gloo with torch 2.13, the DDP model freed during shutdown
    (pytorch/pytorch#190489; gc.collect() after training avoids it). A job that does not end
    holds its GPUs until something kills it, and a job the check had to stop is never a pass.
    A GPU script's job, run on the CPU with gloo standing in for nccl, that hangs there is not
    checked: that hang is gloo's own, in a code path the script's nccl job does not run.
    """
    job = f.job
    if not job.stuck_at_exit:
        return None
    ended = {r for r, _ in job.records("exit")}
    stuck = sorted(set(job.ranks) - ended) or sorted(job.ranks)
    freeing = all(job.records("ddp_freed", rank=r) for r in stuck)
    if freeing and f.asked_nccl and job.device != "cuda":
        return Found(
            f"not checked: {ranks_text(stuck)} did not end while freeing the DDP model on gloo, which "
            "stands in for the script's nccl here: torch 2.13's gloo can hang there "
            "(pytorch/pytorch#190489), a code path an nccl job does not run",
            verdict="--",
        )
    return Found(
        f"every rank finished training, but {ranks_text(stuck)} did not end: stopped "
        f"{job.silence + 10:g} s after the last sign of life"
        + (", while freeing the DDP model" if freeing else "")
    )


@rule(
    "DDP702",
    "warn",
    help="call dist.destroy_process_group() once training is done, on every rank",
)
def not_destroyed(f):
    """A rank never called dist.destroy_process_group() at the end.

    The process group holds connections and, on GPUs, nccl's communicators; without
    destroy_process_group() they are torn down as Python exits, in no particular order, which
    can hang a process or print errors after a run that went well.
    """
    job = f.job
    destroyed = {r for r, _ in job.records("destroy")}
    if destroyed and len(destroyed) == len(job.ranks):
        return None
    if job.hung or f.crash or job.returncode or not job.records("met"):
        return None  # not checked: the job did not finish, or made no group
    missing = sorted(set(job.ranks) - destroyed)
    return Found(
        f"{ranks_text(missing) if destroyed else 'no rank'} called dist.destroy_process_group() at the end"
    )


@summary(7)
def step_7_summary(f):
    job = f.job
    destroyed = {r: e for r, e in job.records("destroy")}
    if destroyed and len(destroyed) == len(job.ranks):
        return "ok", f"every rank destroyed its process group at {next(iter(destroyed.values()))['at']}"
    if job.hung or f.crash or job.returncode:
        return "--", "not checked: the job did not finish"
    return "--", "not checked: no process group was made"
