"""DDP step 9: accumulate gradients with no_sync.

Its rules, in the order they are tried (ORDER), and its summary. A rule's docstring is its
explanation (python check_ddp.py --explain CODE): its first line the summary; then what happens,
why, and what to do."""

from ..judge.registry import Found, rule, summary


def accumulating(f):
    return [e for _, e in f.job.records("step") if e["backward"] > 1 and f.job.records("ddp")]


@rule(
    "DDP901",
    "warn",
    see="no_sync",
    help="wrap the first K-1 in model.no_sync(): the gradients then add up locally, and only the last "
    "backward all-reduces them",
)
def accumulation_without_no_sync(f):
    """Gradient accumulation without no_sync(): every micro-batch's backward all-reduces.

    With K micro-batches an optimizer step, only the last backward needs to all-reduce the
    accumulated gradients. Without model.no_sync() around the first K-1, DDP all-reduces after
    each one: K times the communication, for the same result.
    """
    steps = accumulating(f)
    if not steps:
        return None
    k = max(e["backward"] for e in steps)
    synced = max(e["synced"] if e["prepared"] is None else e["prepared"] for e in steps)
    if synced > 1:
        return Found(
            f"{k} backward passes make each optimizer step, and {synced} of them all-reduce their gradients",
            help=f"wrap the first {k - 1} in model.no_sync(): the gradients then add up locally, and only "
            "the last backward all-reduces them",
        )
    return None


@rule(
    "DDP902",
    "FAIL",
    see="no_sync",
    help="use `with model.no_sync():` around the micro-batches that must not all-reduce (forward and "
    "backward inside it); DDP reads require_backward_grad_sync at forward time, so setting it after the "
    "forward is too late",
)
def steps_on_gradients_never_all_reduced(f):
    """Optimizer steps took gradients that no backward all-reduced: the replicas drift apart.

    DDP decides at each forward, from require_backward_grad_sync, whether the backward that follows
    all-reduces the gradients; the last backward before an optimizer step must, as its all-reduce
    carries every micro-batch's gradients, accumulated. When the last forward of a step had the
    flag off (set False for good, or set True only after the forward: a private flag set too late),
    every rank steps on gradients of its own and the replicas differ. Use model.no_sync() around the
    micro-batches that accumulate, and let the last forward and backward run outside it.
    """
    steps = [e for _, e in f.job.records("step") if e["last"] is False and e["forward"] and e["backward"]]
    if not steps or not f.job.records("ddp"):
        return None
    total = len([e for _, e in f.job.records("step") if e["forward"] and e["backward"]])
    sets = f.source.assignments("require_backward_grad_sync")
    where_set = f" (it is set at {', '.join(f.code(at) for at in sets[:2])})" if sets else ""
    differ = f" The replicas differ at the end: {f.weights_differ}." if f.weights_differ else ""
    return Found(
        f"{len(steps)} of {total} optimizer steps took gradients that no backward all-reduced: the last DDP "
        "forward "
        f"of those steps had require_backward_grad_sync off{where_set}.{differ}",
        follows={4: f"the replicas differ because {len(steps)} optimizer steps were never all-reduced"}
        if f.weights_differ
        else None,
    )


@summary(9)
def step_9_summary(f):
    steps = accumulating(f)
    if not steps:
        return None  # no accumulation: no line
    k = max(e["backward"] for e in steps)
    return "ok", f"{k} micro-batches an optimizer step; only the last backward all-reduces (no_sync)"
