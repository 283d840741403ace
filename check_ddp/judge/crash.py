"""A crash, filed by the call that raised it (never by the phase the job was in), and errors that are
not the script's: a GPU the stand-in cannot give, check_ddp's own."""

import re

from ..steps import SCRIPT
from ..watch.registry import CALLS
from .words import short

# the calls the judge names (CALLS keys)
INIT = "torch.distributed.init_process_group"


BACKWARD = "torch.autograd.backward"


DDP_FORWARD = "torch.nn.parallel.DistributedDataParallel.forward"


ENVIRON_READ = "os._Environ.__getitem__"
TORCH_LOAD = "torch.load"
MAKE_LOADER = "torch.utils.data.DataLoader.__init__"


# a rank's error that says another rank went or never came, not why: gloo says a peer went as
# "Connection closed by peer" or, where the peer's own timeout closed it, "Application timeout caused
# pair closure" (whichever rank of a hang gives up first, the other says one of these)
COMMUNICATION_ERROR = re.compile(
    r"closed by peer|pair closure|reset by peer|Connection refused|Timed out|timed out|"
    r"doesn't match expected size|collective mismatch|Broken pipe|NCCL communicator was aborted|"
    r"Watchdog caught"
)


def crash_step(f, rank, event):
    """The step of the call that raised, where it is a DDP call: a watched call's step (a read of who
    the process is: step 8's; of another variable: none), or step 8 for a line of the script's that
    asks who the process is (a launch variable, the GPUs' count) and raised. SCRIPT for an error of the
    script's own code, a library's, or the script's code a call ran (a model's forward inside DDP's):
    no DDP step's. Never the step the job was in when it failed."""
    call = event.get("call")
    reads = {e["at"] for _, e in f.job.records("read", rank=rank)}
    # the failing line asks who the process is, or uses a name given its value where that was asked
    asked = event.get("at") in reads or bool(reads & f.source.assigned_from(event.get("at")))
    if event.get("within"):  # the script's own code raised, inside the call that ran it
        return SCRIPT
    if call == ENVIRON_READ:
        return 8 if asked else SCRIPT
    if call == TORCH_LOAD and (
        not written_by_the_job(f, rank) or "Weights only load failed" in event["message"]
    ):
        return SCRIPT  # one process fails to load it too (a file no rank wrote; torch.load's own refusal)
    if call in CALLS and CALLS[call].label in ("iter(DataLoader)", "next(DataLoader)"):
        # the data's own error (a dataset's, a worker's, the batch's collation): a sampler only picks the
        # indices, and one process, which draws every index, fails on the same sample
        return SCRIPT
    if call == MAKE_LOADER and f.source.loader_without_sampler(event.get("at")):
        return SCRIPT  # a DataLoader given no sampler: the single-process script makes the same one
    if call in CALLS and call.startswith("torch.distributed.") and CALLS[call].step == 5:
        # a collective is the step's that uses it: a broadcast made while resuming is step 6's
        step = crash_phase(f, rank)[1]
        return step if step in (6, 10) else 5
    if call in CALLS:
        return CALLS[call].step
    return 8 if asked else SCRIPT


def written_by_the_job(f, rank):
    """Whether the file the rank was loading when it failed (its last torch.load) is one some rank of this
    job saved or wrote: a checkpoint of the job's, which its ranks may race for."""
    loads = [e for e in f.job.ranks.get(rank, []) if e["e"] == "load"]
    path = loads[-1]["path"] if loads else None
    written = {e["path"] for _, e in [*f.job.records("save"), *f.job.records("write")]}
    return path is None or path in written | {f.renamed.get(p, p) for p in written}


# what a rank was doing, told by the last of its records before an error: (words, the call that
# tells it, step)
PHASES = {
    "load": ("while resuming", "torch.load()", 6),
    "load_state": ("while resuming", "load_state_dict()", 6),
    "save": ("while saving", "torch.save()", 6),
    "eval": ("while evaluating", "a forward without gradients", 10),
    "step": ("while training", None, 4),
    "ddp": ("before training", "DDP(...)", 4),
    "met": ("after the group was made, before DDP wrapped the model", None, 3),
}


def crash_phase(facts, rank):
    """What the rank was doing when it failed, from its last telling record: (words, step); the
    words name the call that tells it where it is not the line that failed."""
    crash = facts.crash[1] if facts.crash and facts.crash[0] == rank else {}
    call = crash.get("call") or ""
    if call == "torch.save" or call.startswith("torch.distributed.checkpoint"):  # the call says it
        return "while checkpointing", 6
    for e in reversed(facts.job.ranks.get(rank, [])):
        if e["e"] == "pass" and e["loader"] in facts.evaluation:
            return "while evaluating", 10
        if e["e"] in PHASES:
            words, call, step = PHASES[e["e"]]
            if call and e.get("at") and e["at"] != crash.get("at"):
                words += f" (after {call} at {e['at']})"
            return words, step
    return "before the process group was made", 8


def needs_gpu(f, rank, event):
    """An error that says CUDA or NCCL is missing (this torch has neither), or that the stand-in lacks
    something, whichever call raised it: the script's own GPU code, torch's, a CUDA extension's,
    Triton's. Not the script's own raise (its check of what it was given), nor a GPU the stand-in
    refused as CUDA or torch would (its gpu record says so), which is the script's."""
    text = f"{event['type']}: {event['message']}" if event else ""
    return bool(
        event
        and event["raised"] != "raise"
        and rank not in f.refused
        and re.search(r"CUDA|NVIDIA|NCCL|nccl|cuda|GPU|[Tt]riton|StandIn|accelerator", text)
        and "SyncBatchNorm" not in event["message"]
        and not re.search(r"out of memory", event["message"])
    )


def own_errors(job, rule_errors=()):
    """check_ddp's own errors in this job, as lines to show: its bookkeeping's (caught, the script
    went on), one that stopped the script, and its rules' that failed judging it (rule_errors). Never
    the script's: the check is incomplete."""
    found = [
        f"check_ddp.py's own error at {e['at']}, caught (your script went on): {e['type']}: "
        f"{short(e['message'])}"
        for _, e in job.records("fault")
    ]
    refused = {r for r, e in job.records("gpu") if e["refused"]}  # the stand-in's refusal: the call's
    found += [
        f"check_ddp.py's own error stopped rank {r}: {e['type']}: {short(e['message'])}"
        for r, e in job.records("crash")
        if e["raised"] == "checker" and r not in refused
    ]
    found += [f"check_ddp.py's own error in its rule {text}" for text in rule_errors]
    return list(dict.fromkeys(found))
