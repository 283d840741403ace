"""DDP step 5: all-reduce the metrics.

Its rules, in the order they are tried (ORDER), and its summary. A rule's docstring is its
explanation (python check_ddp.py --explain CODE): its first line the summary; then what happens,
why, and what to do."""

import collections

from ..judge.evidence import out_of_step, reduced_sites, whole_passes
from ..judge.registry import Found, rule, summary
from ..judge.words import plural


@rule(
    "DDP508",
    "FAIL",
    hang=True,
    across=True,
    see="rank_zero_collective",
    help="every rank must call the same collectives, in the same order: take each out of any branch only "
    "some ranks take",
)
def collectives_differ(f):
    """The ranks called different collectives: a call one rank makes and another does not.

    A collective pairs each rank's call with the other ranks' calls in the order they come. When
    one rank calls all_reduce where another calls barrier, or nothing, the calls that meet do not
    belong together: the job hangs, fails on mismatched sizes, or (worse) goes on with numbers
    that mean nothing. Compared rank by rank, the first call that differs is where they part.
    """
    return out_of_step(f, "unmatched")


@rule(
    "DDP506",
    "warn",
    launch="follows",
    see="metrics",
    help="sum (loss x samples, samples) on each rank, then dist.all_reduce() it, once an epoch",
)
def metrics_not_reduced(f):
    """A training metric that no collective touches is reported: what rank 0 reports is its own shard's.

    Each rank computes its loss on its own shard. A loss printed by rank 0 without an
    all-reduce is an estimate from 1/N of the data, however it is kept (a running float, a stacked
    tensor of totals, a meter object, a dict written to a file) and however it is read out. Sum
    (loss x samples, samples) on each rank, all-reduce the sums, and divide. The check reads the
    script's training loop: what it adds up of the loss, followed to where it is read out, and
    whether a collective is given it (or what is made of it) on the way.
    """
    job = f.job
    if not job.ranks:
        return None
    epochs = len(
        [e for _, e in job.records("pass", rank=min(job.ranks)) if e["loader"] in f.training_loaders]
    )
    if (f.crash or job.hung or job.returncode) and epochs < 2:
        return None  # stopped before an epoch's end, where the sums would be all-reduced: no evidence
    if not job.records("step") or f.world < 2:
        return None
    if not reduced_sites(f):
        return Found("no metric is all-reduced: what rank 0 reports is its own shard's")
    reads = training_reads(f)
    if reads and not reduced_sites(f, evaluating=False):  # only the held-out sums are: DDP step 10's
        return Found(
            f"the training loss read at {f.code(reads[0])} is never all-reduced: what rank 0 reports of "
            f"training is its own shard's (the all-reduce at "
            f"{' and '.join(reduced_sites(f, evaluating=True))} follows the evaluation: DDP step 10's)"
        )
    # however it is stored (a running float, a stacked tensor of totals, a meter, a dict) and read out
    for m in f.source.training_metrics():
        if m.reads and not m.reduced:
            return Found(
                f"the training {m.name} added up at {f.code(m.at)} is never all-reduced, and the script "
                f"reads it out at {f.code(m.reads[0])}: what it reports of training is its own shard's"
            )
    return None


@rule(
    "DDP505",
    "warn",
    see="metrics",
    help="on a GPU each waits for the GPU to finish; sum (loss x samples, samples) on the device and "
    "all-reduce it once an epoch",
)
def host_sync_every_step(f):
    """A host sync at every step, for logging (.item(), or a collective).

    On a GPU, .item() and a blocking all-reduce make the CPU wait until the GPU has finished all
    it was given: the next step's work is queued only after, and the GPU idles in between.
    Keep sums on the device, (loss x samples, samples), and all-reduce them once an epoch.
    """
    job = f.job
    steps = job.records("step", rank=min(job.ranks)) if job.ranks else []
    n = len(steps)
    # more than once an epoch, where the epochs are known (the training loader's passes); else 8 steps
    epochs = sum(len(whole_passes(loader).get(min(job.ranks), [])) for loader in f.training_loaders.values())
    if n < (max(3, epochs + 1) if epochs else 8):
        return None
    sites = {}
    for _, e in job.records("coll", rank=min(job.ranks)):
        sites.setdefault((e["name"], e["at"]), set()).add(e["step"])
    every_step = [
        f"dist.{name}() at {f.code(at)}"
        for (name, at), at_steps in sites.items()
        if len(at_steps) >= 0.9 * n
        and name in ("all_reduce", "reduce", "all_gather", "barrier")
        and not (f.synced_by_hand and name == "all_reduce")  # the gradients' own all-reduce, done by hand
    ]
    items = {}
    for _, e in steps:
        for at in e["items"]:
            items[at] = items.get(at, 0) + 1
    every_step += [f".item() at {f.code(at)}" for at, count in items.items() if count >= 0.9 * n]
    if every_step:
        return Found(
            f"a host sync (the CPU waiting for the GPU) at every one of {n} optimizer steps, for logging: "
            + "; ".join(every_step)
        )
    return None


def training_reads(f):
    """Where the lowest rank read a value on the host (.item()) at most of its optimizer steps: a training
    metric, most read first."""
    steps = f.job.records("step", rank=min(f.job.ranks))
    counts = collections.Counter(at for _, e in steps for at in e["items"])
    return [at for at, n in counts.most_common() if n >= 0.5 * len(steps)]


@summary(5)
def step_5_summary(f):
    job = f.job
    steps = job.records("step", rank=min(job.ranks)) if job.ranks else []
    if not steps:
        return "--", "not checked: no optimizer step ran"
    reduced = reduced_sites(f, evaluating=False)
    if not reduced_sites(f):
        return "--", "not checked: no metric was all-reduced before the job stopped"
    if not reduced:  # the held-out numbers alone: DDP step 10's
        return "ok", f"all-reduced after evaluating only, at {' and '.join(reduced_sites(f))} (DDP step 10)"
    calls = sum(1 for _, e in job.records("coll", rank=min(job.ranks)) if e["at"] in reduced)
    return (
        "ok",
        f"all-reduced at {' and '.join(reduced)}: {plural(calls, 'call')} in "
        f"{plural(len(steps), 'optimizer step')}",
    )
