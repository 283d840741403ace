"""Evidence several steps' rules share. Ranks that fall out of step (the job hangs, or a rank loses its
peers): each cause is the rule of the step the README teaches it in (uneven inputs: DDP307, step 3; a
collective only some ranks call: DDP508, step 5; one in a rank-only block: DDP609, step 6; an early
stop each rank decides alone: DDP1007, step 10), a cause the records do not show DDP504's (at the
end). Each is tried first in its step: a hang explains what else looks wrong. And the passes over the
data, the datasets the ranks built, the metrics they reduced, what they evaluated."""

import collections
import os
import re

from ..watch.collectives import COLLECTIVES, REDUCING
from ..watch.registry import CALLS
from .crash import BACKWARD, COMMUNICATION_ERROR, DDP_FORWARD
from .registry import Found
from .words import by_line, ordinal, plural, ranks_text, short


def fell_out_of_step(f):
    """How the ranks fell out of step, if they did: the text of a hang (where each rank waits),
    or of a rank that lost its peers; None. Asked by the rules after step 1, once step 1 has said
    whether it explains a hang (the ranks never met)."""
    job = f.job
    if f.children_collide:
        return None  # processes of the script's own, standing for one child: step 8's
    if job.hung and job.records("met") and "hang" not in f.explained:
        return f"the job stopped making progress ({job.silence:g} s without any): {where_each_waits(f)}"
    if f.crash and COMMUNICATION_ERROR.search(f.crash[1]["message"]) and why_out_of_step(f, hang=False):
        rank, e = f.crash
        return f"rank {rank} lost its peers at {f.code(e['at'])} ({short(e['message'])})"
    # no rank's error: a rank killed (gloo aborts one whose collective's sizes differ), and torchrun
    # stopped the others before their own error came (seen under load)
    if job.returncode and not f.crash and not job.records("exit") and why_out_of_step(f, hang=False):
        return f"the job was stopped, no rank's error recorded: {where_each_was(f)}"
    return None


def where_each_was(f):
    """Each rank's last known place, from its last record that says one: where the main thread
    was (twice a second), a collective it called since, or the line of the script's own that anything
    else it recorded since was at (a pass over a loader, an input to the model)."""
    parts = []
    for rank, events in sorted(f.job.ranks.items()):
        call = at = None
        for e in events:
            if e["e"] == "now" and e["stack"]:
                call, at = e["call"], e["stack"][0]
            elif e["e"] == "coll":
                call, at = f"torch.distributed.{e['name']}", e["at"]
            elif e.get("at") and e["e"] != "now":
                call, at = None, e["at"]
        what = CALLS[call].label if call in CALLS else "its own code"
        parts.append(f"rank {rank} was last in {what} at {f.code(at)}" if at else f"rank {rank}: not known")
    return "; ".join(parts)


def unmatched_text(f):
    i, calls = f.unmatched_collective
    said = [
        f"rank {r} called {'dist.' * (c['name'] in COLLECTIVES)}{c['name']}() at {f.code(c['at'])}"
        if c
        else f"rank {r} called none"
        for r, c in sorted(calls.items())
    ]
    # the script's own, counted in order: DDP's in forward and backward are not among them
    return f"the {ordinal(i + 1)} collective the script itself calls differs between the ranks: " + "; ".join(
        said
    )


def where_each_waits(f):
    parts = []
    for rank in sorted(f.job.ranks):
        call, at, _ = f.waiting.get(rank, (None, None, []))
        what = CALLS[call].label if call in CALLS else "its own code"
        if call == BACKWARD and f.job.records("ddp"):
            what = "backward(), DDP's gradient all-reduce"
        parts.append(f"rank {rank} waits in {what} at {f.code(at)}" if at else f"rank {rank}: not known")
    return "; ".join(parts) or "no rank started"


def why_out_of_step(f, hang=True):
    """Why the ranks fell out of step, seen from what each did: (what kind of cause, the cause as
    evidence: "rank_block", a collective only some ranks reach; "uneven", ranks with different
    numbers of batches; "early_stop", ranks that left the loop apart; "unmatched", collectives that
    differ between ranks), or None. Each rank's collectives, compared, show it on every run, whether
    the job hung, failed, or (by luck, pairing calls that do not belong together) ended; only a hang shows
    where each rank waits."""
    unmatched = f.unmatched_collective
    apart = sharded_evaluation_apart(f)
    if apart:  # a sharded model's forward without gradients on some ranks only: step 10's
        return "eval_alone", apart
    alone = {r: e for r, e in (f.divergence.alone if f.divergence else {}).items() if e["e"] == "eval"}
    if alone:  # a forward through DDP, its buffers synced, on some ranks only: the first divergence
        r, e = min(alone.items())
        return "eval_alone", (
            f"rank {r} evaluated through the DDP model at {f.code(e['at'])}, and the other ranks did not: "
            "DDP's forward syncs the model's buffers with every rank"
        )
    waiting = f.waiting if hang else {}
    for r, (call, at, _) in sorted(waiting.items()):  # a forward without gradients, through DDP: step 10's
        if call == DDP_FORWARD and evaluating(f, r) and any(c != DDP_FORWARD for c, _, _ in waiting.values()):
            return "eval_alone", (
                f"rank {r} evaluates through the DDP model at {f.code(at)}, and the other ranks do not: "
                "DDP's forward syncs the model's buffers with every rank"
            )
    for r, c in sorted(unmatched[1].items()) if unmatched else ():
        condition = c and f.source.rank_condition(c["at"])
        if condition:
            return (
                "rank_block",
                f"{unmatched_text(f)}: rank {r}'s is inside `{condition}`, which only some ranks meet",
            )
    for _, (call, at, stack) in sorted(f.waiting.items() if hang else ()):
        for line in stack if call and call != BACKWARD else ():
            condition = f.source.rank_condition(line)
            if condition:
                reached = f"{CALLS[call].label} at {at}" + (f", called from {line}," if line != at else "")
                return "rank_block", f"{reached} is inside `{condition}`: only some ranks reach it"
    if not f.job.records("join"):
        for loader in f.loaders.values():
            batches = {r: e["batches"] for r, e in loader["made"].items() if e["batches"] is not None}
            if loader["training"] and len(set(batches.values())) > 1:
                return "uneven", (
                    "the ranks have different numbers of batches an epoch ("
                    + ", ".join(f"rank {r}: {n}" for r, n in sorted(batches.items()))
                    + f", DataLoader at {next(iter(loader['made'].values()))['at']}): uneven inputs, and "
                    "every backward() all-reduces with every rank"
                )
    steps = {r: len([e for e in events if e["e"] == "step"]) for r, events in f.job.ranks.items()}
    if len(set(steps.values())) > 1:
        return "early_stop", (
            "the ranks left the training loop at different steps ("
            + ", ".join(f"rank {r}: {c}" for r, c in sorted(steps.items()))
            + ")"
        )
    epochs = {  # a rank that went on began a pass over the training data that another did not
        r: len([e for e in events if e["e"] == "pass" and e["loader"] in f.training_loaders])
        for r, events in f.job.ranks.items()
    }
    if len(set(epochs.values())) > 1:
        return "early_stop", (
            "the ranks left the training loop in different epochs ("
            + ", ".join(f"rank {r}: {plural(c, 'pass')}" for r, c in sorted(epochs.items()))
            + " over the training data)"
        )
    if unmatched:
        return "unmatched", unmatched_text(f)
    return None


def out_of_step(f, kind):
    """The finding of a rule about ranks falling out of step, when the cause is of its kind (None:
    no cause the records show)."""
    stall = fell_out_of_step(f)
    if stall is None and f.unmatched_collective is None:
        return None
    hang = f.job.hung and "hang" not in f.explained
    cause = why_out_of_step(f, hang=hang)
    if (cause[0] if cause else None) != kind:
        return None
    follows = None
    unmatched = f.unmatched_collective
    if unmatched and kind in (
        "rank_block",
        "unmatched",
    ):  # a metric all-reduced on some ranks only: its step's too
        names = {c["at"] for c in unmatched[1].values() if c and c["name"] in REDUCING}
        said = f"its all-reduce at {', '.join(sorted(names))} is one only some ranks call"
        follows = {
            step: said
            for step, evaluating in ((5, False), (10, True))
            if names
            and set(reduced_sites(f, evaluating=evaluating)) <= names
            and reduced_sites(f, evaluating)
        }
    said = cause[1][0].upper() + cause[1][1:] if cause else ""
    if stall is None:  # the job ended, as if well: the ranks' collectives say otherwise
        return Found(said, follows=follows)
    if hang:
        return Found(stall + (f". {said}" if cause else ""), follows=follows)
    return Found(f"{stall}. {said}", explains=("crash",), follows=follows)


def own_parts(loader):
    """Whether each rank's DataLoader holds a dataset of its own: their data, or their lengths, differ."""
    made = loader["made"].values()
    data, lengths = {e["data"] for e in made}, {e["length"] for e in made}
    return (len(data) > 1 and None not in data) or (len(lengths) > 1 and None not in lengths)


def datasets_differ(f, loader, splits=False):
    """The ranks whose copies of the loader's dataset differ, and the message saying so; or None. With
    splits, a Subset of one dataset drawn apart on each rank (random_split seeded by rank) is a dataset
    of its own on each (a split by rank on purpose is another Subset on each too: splits is for a
    sampler that assumes one dataset, DistributedSampler)."""
    made = loader["made"]
    data = {r: (e["data"], e["subset"] if splits else None) for r, e in made.items()}
    if len(set(data.values())) > 1 and None not in (d for d, _ in data.values()):
        at = next(iter(made.values()))["at"]
        split = len({d for d, _ in data.values()}) == 1  # one dataset, split apart on each rank
        what = "the split (the Subset) of one dataset" if split else "the data"
        return (
            f"the ranks built different datasets: {what} under the DataLoader at {f.code(at)} differs "
            f"between {ranks_text(sorted(data))}"
        )
    return None


def whole_passes(loader):
    """Each rank's whole passes over a loader, its epochs: a script may peek at one batch
    (next(iter(loader))) to learn its size, and that pass is not an epoch."""
    whole = {}
    for rank, passes in loader["passes"].items():
        longest = max((len(p) for p in passes), default=0)
        whole[rank] = [p for p in passes if longest and len(p) >= longest / 2]
    return whole


def sharded_unchanged(f):
    """Whether the sharded model's parameters, as each rank holds them, are at the end what they were
    when sharded, after optimizer steps (True), changed (False), or not known (None)."""
    shards = {r: e for r, e in f.job.records("shard")}
    ends = {r: e for r, e in f.job.records("exit") if e["sharded"] is not None and e["steps"]}
    if not shards or not ends or set(ends) - set(shards):
        return None
    return all(ends[r]["sharded"] == shards[r]["local"] for r in ends)


def reduced_sites(f, evaluating=None):
    """Where the lowest rank called a reducing collective: all of them, or (evaluating=True/False)
    those after an evaluation began and before training went on (DDP step 10's), or the others."""
    found, now = set(), False
    # where the code gives a training metric to the collective (a tensor of training and held-out sums
    # together): training's too
    training = {at for m in f.source.training_metrics() for at in m.reduced_at}
    for e in f.job.ranks.get(min(f.job.ranks), []) if f.job.ranks else []:
        if e["e"] == "eval" or (e["e"] == "pass" and e["loader"] in f.evaluation):
            now = True
        elif e["e"] == "step" or (e["e"] == "pass" and e["loader"] in f.training_loaders):
            now = False
        elif e["e"] == "coll" and e["name"] in REDUCING:
            # whose the reduced tensor is: where the script filled it, with gradients off (the held-out
            # numbers) or on (training's); where the code does not say, what the job was doing
            held_out = f.source.filled_without_gradients(e["at"])
            if evaluating in (None, now if held_out is None else held_out) or (
                evaluating is False and e["at"] in training
            ):
                found.add(e["at"])
    return sorted(found, key=by_line)


def sharded_evaluation_apart(f):
    """Where ranks evaluated through a sharded model a different number of times at a line: the text
    saying so, or None. Each such forward all-gathers the parameters, with every rank."""
    counts = collections.defaultdict(collections.Counter)
    for r, e in f.job.records("eval"):
        if e["through"] == "sharded":
            counts[e["at"]][r] += 1
    for at, by in sorted(counts.items()):
        runs = {r: by.get(r, 0) for r in f.job.ranks}
        if len(set(runs.values())) > 1:
            said = ", ".join(f"rank {r} {plural(n, 'time')}" for r, n in sorted(runs.items()))
            return (
                f"the ranks evaluated through the sharded model at {f.code(at)} apart ({said}): each such "
                "forward all-gathers the parameters with every rank, and the ranks' collectives part there"
            )
    return None


def evaluating(f, rank):
    """Whether the rank was evaluating when it stopped: a forward without gradients, or a pass over an
    evaluation loader, came after its last optimizer step and its last pass over training data."""
    for e in reversed(f.job.ranks.get(rank, [])):
        if e["e"] == "eval":
            return True
        if e["e"] == "pass":
            return e["loader"] in f.evaluation
        if e["e"] == "step":
            return False
    return False


def crashed_in_evaluation(f):
    return f.crash is not None and f.crash[1].get("loader") in f.evaluation


def once_per_node(f, by):
    """Whether the ranks of `by` ({rank: its write or save record}) are one a node, each writing under a
    test of its local rank (`if local_rank == 0:`, at the write, or where it was called from): a file
    made once per node, by design. On one machine that is one writer; on nodes that share a disk, one a
    node, at once. (The rehearsed nodes share this machine's disk.)"""
    nodes = [f.starts[r]["node"] for r in by]
    if len(by) < 2 or len(set(nodes)) != len(nodes):
        return False
    return all(
        any(
            re.search(r"local", f.source.rank_condition(at) or "", re.I) for at in e.get("stack") or [e["at"]]
        )
        for e in by.values()
    )


def written_once_per_node(f):
    """The files written once per node ({path: {rank: its first save or write of it}}), each rank's
    write with something in it (a file it opened and left empty is no write)."""
    by_path = {}
    for r, e in [*f.job.records("save"), *f.job.records("write")]:
        path = f.renamed.get(e["path"], e["path"])
        if path and (e["e"] == "save" or e["how"] == "os.mkdir" or f.wrote_into(r, e["path"])):
            by_path.setdefault(path, {}).setdefault(r, e)
    return {path: by for path, by in sorted(by_path.items()) if once_per_node(f, by)}


def per_node_finding(f, before_training):
    """A file written once per node, before training began (the data, prepared) or after (a checkpoint,
    a log): the finding of a multi-node risk, said as such; where the job stopped on that file (torn by
    the other node's write, on this machine's one disk), what it explains, and the rest is checked again
    as one node (the rule's sets_aside)."""
    for path, by in written_once_per_node(f).items():
        first_steps = {r: first_index(f, r, "step") for r in by}
        early = all(first_steps[r] is None or index_of(f, r, e) < first_steps[r] for r, e in by.items())
        if early != before_training:
            continue
        e = by[min(by)]
        guard = next(
            (
                g
                for at in e.get("stack") or [e["at"]]
                if (g := f.source.rank_condition(at)) and "local" in g.lower()
            ),
            "",
        )
        stopped = f.crash is not None and stopped_on(f, path)
        return Found(
            f"{ranks_text(by)}, local rank 0 of each node (`{guard}`), wrote {f.job.relpath(path)} at "
            f"{f.code(e['at'])}: once per node, so on nodes that share a disk they write it at once (a "
            "risk of several machines: here the rehearsed nodes share this one's disk"
            + (
                f", and rank {f.crash[0]} stopped on the file: {short(f.crash[1]['message'])})"
                if stopped
                else ")"
            ),
            explains=("crash",) if stopped else (),
        )
    return None


def first_index(f, rank, kind):
    return next((i for i, e in enumerate(f.job.ranks[rank]) if e["e"] == kind), None)


def index_of(f, rank, event):
    return next(i for i, e in enumerate(f.job.ranks[rank]) if e is event)


def stopped_on(f, path):
    """Whether the job's crash was on path: its error names it, or the rank's last read of a file (a
    torch.load) before the crash was of it."""
    rank, e = f.crash
    if e["path"] == path or os.path.basename(path) in (e["message"] or ""):
        return True
    loads = [x for x in f.job.ranks[rank] if x["e"] == "load"]
    return bool(loads) and loads[-1]["path"] == path and e.get("call") == "torch.load"
