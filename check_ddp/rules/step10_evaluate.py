"""DDP step 10: evaluate exactly.

Its rules, in the order they are tried (ORDER), and its summary. A rule's docstring is its
explanation (python check_ddp.py --explain CODE): its first line the summary; then what happens,
why, and what to do."""

from ..judge.crash import COMMUNICATION_ERROR, DDP_FORWARD
from ..judge.evidence import (
    crashed_in_evaluation,
    datasets_differ,
    evaluating,
    out_of_step,
    sharded_evaluation_apart,
)
from ..judge.registry import Found, rule, summary
from ..judge.words import ranks_text, short


@rule(
    "DDP1007",
    "FAIL",
    hang=True,
    across=True,
    see="early_stop",
    help="decide to stop from values every rank has (all-reduce the metric first), so that all stop together",
)
def left_loop_apart(f):
    """The ranks left the training loop at different steps (an early stop decided by each rank alone).

    A decision to stop taken from a rank's own loss, a time limit, or a local counter, differs
    between ranks: one leaves, the others wait in their next collective. Decide from values
    every rank has, all-reduced, so that all stop at the same step.
    """
    return out_of_step(f, "early_stop")


@rule(
    "DDP1001",
    "FAIL",
    hang=True,
    across=True,
    see="eval_through_ddp",
    explains=("crash", "hang"),
    help="evaluate the bare model, model.module, under torch.no_grad(), where some ranks evaluate alone; "
    "or evaluate through DDP on every rank",
)
def evaluated_through_ddp_alone(f):
    """A rank evaluated through the DDP model while the others did not: DDP's forward waits for them.

    DDP's forward() takes part in collectives (it syncs buffers such as BatchNorm's running
    statistics from rank 0, on every call). Evaluating through it on rank 0 alone (a last
    evaluation, a sample for the log) leaves rank 0 waiting for ranks that are not there: on nccl
    a hang until the timeout, on gloo "Connection closed by peer" once the others have ended. What
    it keeps from happening (the checkpoint after it, the clean-up) follows from it. Evaluate the
    bare model, model.module, or evaluate through DDP on every rank.
    """
    sharded = sharded_evaluation_apart(f)
    found = out_of_step(f, "eval_alone")  # the ranks out of step, or a hang
    if found is None and sharded:  # a sharded model's forward all-gathers: the collectives part, in time
        found = Found(sharded[0].upper() + sharded[1:], explains=())
    if found is not None:
        found.follows = {6: "", 7: ""}
        if sharded:
            found.see, found.help = (
                "fsdp_eval_alone",
                (
                    "evaluate on every rank, each its share of the held-out set, then all-reduce (sum, "
                    "count): a sharded model's forward is a collective"
                ),
            )
        return found
    if not f.crash:
        return None
    rank, e = f.crash
    if (
        e.get("call") != DDP_FORWARD
        or not COMMUNICATION_ERROR.search(e["message"])
        or not evaluating(f, rank)
    ):
        return None
    here = len([x for _, x in f.job.records("eval", rank=rank) if x["at"] == e["at"]])
    others = [
        r
        for r in f.job.ranks
        if r != rank and len([x for _, x in f.job.records("eval", rank=r) if x["at"] == e["at"]]) < here
    ]
    if not others:
        return None
    return Found(
        f"rank {rank} evaluated through the DDP model at {f.code(e['at'])}, and {ranks_text(others)} did "
        f"not: DDP's forward waits for them ({short(e['message'])})",
        follows={6: "", 7: ""},
    )


@rule(
    "DDP1002",
    "warn",
    help="for an exact number, let every rank evaluate its shard of the held-out set, then all-reduce "
    "(sum, count)",
)
def evaluated_alone(f):
    """Rank 0 alone evaluated: its held-out number comes from its own batches, not the held-out set.

    An evaluation done by one rank, on the batches it happens to have, estimates the held-out
    metric from a part of it. For the exact number, let every rank evaluate its shard of the
    held-out set, and all-reduce (sum, count).
    """
    if f.evaluation:
        return None
    through_ddp = {r: e["evaluations"] for r, e in f.job.records("exit")}
    alone = sorted(r for r, n in through_ddp.items() if n)
    if len(through_ddp) == f.world > 1 and len(alone) == 1:
        return Found(
            f"rank {alone[0]} alone evaluated ({through_ddp[alone[0]]} forwards without gradients, none on "
            "the other ranks): its held-out number is an estimate from its own batches, not the held-out set"
        )
    return None


@rule(
    "DDP1008",
    "FAIL",
    across=True,
    help="give each rank its own part of the held-out data, chosen by its global rank (dist.get_rank(), not "
    "LOCAL_RANK), or seed each rank's generator by it; then all-reduce (sum, count)",
)
def evaluated_alike_then_combined(f):
    """Every rank evaluated the very same batches, and the ranks then combined what they had.

    A collective after an evaluation (all_reduce, all_gather) combines the ranks' parts. Here the
    parts are one and the same: each sample is counted N times, and whatever the other ranks were
    meant to evaluate never was. Ranks on different nodes choose alike when the choice comes from
    LOCAL_RANK (the same on every node), or from a generator seeded alike. Choose by the global
    rank.
    """
    by_hand = f.evaluated_by_hand
    if by_hand and by_hand[1] and f.evaluated_alike:
        return Found(
            f"every rank evaluated the very same batches (from {f.code(by_hand[0])}), and the ranks then "
            "combined them: each counted as many times as there are ranks, and the parts meant for the "
            "others never evaluated"
        )
    return None


@rule(
    "DDP1005",
    "warn",
    help="give each rank its shard of the held-out set (rank r: samples r, r + N, ...), and all-reduce "
    "(sum, count): the same number, N times faster",
)
def every_rank_evaluates_everything(f):
    """Every rank evaluated the whole held-out set: exact, and N times the work for nothing.

    The number is right, but each of the N processes computes it all: the evaluation takes as
    long as on one process, and N - 1 of them throw their result away. Give each rank its shard
    and all-reduce the sums.
    """
    if not crashed_in_evaluation(f) and f.evaluated and f.evaluated[0] == "all":
        _, _, at, union, _ = f.evaluated
        return Found(
            f"every rank evaluated all {union} held-out samples (DataLoader at {f.code(at)}): exact, and "
            f"{f.world} times the work"
        )
    if f.evaluated_by_hand and f.evaluated_alike:
        return Found(
            "every rank evaluated the very same batches, without a DataLoader (from "
            f"{f.code(f.evaluated_by_hand[0])}): "
            f"the held-out number is exact on each, and {f.world} times the work"
        )
    return None


@rule(
    "DDP1006",
    "warn",
    see="metrics",
    help="all-reduce the held-out sums (loss x samples, samples) after evaluating, before dividing; or give "
    "each rank its shard of a held-out DataLoader",
)
def evaluation_by_hand_not_reduced(f):
    """Every rank evaluated batches of its own, drawn without a DataLoader, and no collective followed.

    Each rank's held-out loss is a mean over the batches it drew: an estimate, different on
    every rank, and rank 0 reports its own. All-reduce the sums before dividing, so that the
    number is the mean over every rank's batches.
    """
    by_hand = f.evaluated_by_hand
    if by_hand and not by_hand[1] and not f.evaluated_alike:
        return Found(
            f"every rank evaluated batches of its own without a DataLoader (forwards without gradients "
            f"from {f.code(by_hand[0])}), and no collective followed: each rank's held-out number is its "
            "own batches'"
        )
    return None


@rule(
    "DDP1009",
    "FAIL",
    see="metrics",
    help="all-reduce what each rank counted (correct, loss x samples, and the samples) before dividing: "
    "len(loader.dataset) is the whole set's size, not the rank's shard's",
)
def shard_divided_by_whole_set(f):
    """Each rank divides what it counted on its shard by the whole held-out set's size: 1/N of the value.

    pytorch/examples' mnist divides its test sums by len(test_loader.dataset). Converted to DDP
    with a DistributedSampler on the test set, each rank counts its shard (1/N of the set), while
    len(test_loader.dataset) is still the whole set's size: the accuracy and the loss each rank
    reports are about 1/N of the true ones, not an estimate of them. All-reduce the sums and the
    count first, then divide (one process would not show it: its shard is the whole set).
    """
    if crashed_in_evaluation(f) or not f.evaluated or f.evaluated[0] != "unreduced":
        return None
    at = f.evaluated[2]
    divided = f.source.divided_by_whole_set(at)
    if not divided:
        return None
    return Found(
        f"each rank evaluated only its own shard of the held-out set (DataLoader at {f.code(at)}), and no "
        f"collective followed; {f.code(divided[0])} divides what the rank counted by the size of the whole "
        f"set (the loader's dataset), not of its shard: each rank's metric is about 1/{f.world} of the "
        "true one"
    )


@rule(
    "DDP1003",
    "warn",
    see="metrics",
    help="sum (loss x samples, samples) and correct counts on each rank, then dist.all_reduce() them before "
    "dividing",
)
def evaluation_not_reduced(f):
    """Each rank evaluated only its shard of the held-out set, and no collective followed.

    With a DistributedSampler on the held-out set, each rank sees 1/N of it; the metric each
    rank then reports is its shard's alone, and differs from rank to rank: an estimate from 1/N of
    the held-out set, reported as the job's (a warning, as a training loss of rank 0's shard is, DDP506).
    Sum (loss x samples, samples, correct) on each rank and all-reduce the sums before dividing.
    """
    if not crashed_in_evaluation(f) and f.evaluated and f.evaluated[0] == "unreduced":
        at = f.evaluated[2]
        return Found(
            f"each rank evaluated only its own shard of the held-out set (DataLoader at {f.code(at)}), and "
            "no collective followed: the held-out metric each rank has is its shard's alone"
        )
    return None


@rule(
    "DDP1004",
    "warn",
    help="give rank r the samples range(r, len(dataset), world_size), then all-reduce (sum, count)",
)
def evaluation_padded(f):
    """The held-out shards repeat samples: DistributedSampler pads them, so a mean counts those twice.

    DistributedSampler makes every shard the same size by repeating samples when N does not
    divide the dataset. For training that is harmless; for an exact held-out metric the
    repeats count twice. Give rank r the samples r, r + N, ..., and all-reduce (sum, count).
    """
    if not crashed_in_evaluation(f) and f.evaluated and f.evaluated[0] == "padded":
        _, _, at, union, repeats = f.evaluated
        return Found(
            f"the held-out shards repeat {repeats} of {union} samples (DataLoader at {f.code(at)}): "
            "DistributedSampler pads them, so a mean counts those twice"
        )
    return None


@summary(10)
def step_10_summary(f):
    if f.evaluated_by_hand and f.evaluated_by_hand[1]:
        return "ok", (
            f"each rank evaluated without a DataLoader (from {f.evaluated_by_hand[0]}), then all-reduced"
        )
    if crashed_in_evaluation(f) or not f.evaluated:
        return None  # no evaluation; or the script's own error in it, reported as such in this step
    how, i, at, union, _ = f.evaluated
    differ = datasets_differ(f, f.evaluation[i])
    if differ:  # indices counted once each, of sets that are not one: no "each once" to claim
        return "--", f"not checked whether each held-out sample counts once: {differ} (DDP step 3's rule)"
    if how == "all":  # DDP1005's, where the script silences it
        return "ok", f"every rank evaluated all {union} held-out samples: exact (DataLoader at {at})"
    return (
        "ok",
        f"each rank evaluated its own shard, then all-reduced: {union} held-out samples, each once "
        f"(DataLoader at {at})",
    )
