"""The first divergence between the ranks: where their calls part.

A correct DDP job's ranks make the same calls, in the same order, with the same effect on what they
share: they make the group, the loaders, the model's wrapper and its optimizer, load the same
checkpoint, are told the same epoch, join the same collectives. What a rank is meant to do alone
(rank 0's writes and prints, a file it saves) is left out, and so is what a rank does after its last
collective (a test of its own, once training is done): nothing of it can put the ranks out of step.
As torch's flight recorder lines up each rank's collectives and names the first that differs, this
lines up each rank's shared calls and names the first place they differ: the cause; what differs
after it follows from it."""

import os
from dataclasses import dataclass

# the records of calls every rank makes alike (and of what they are told: an epoch, a file to load)
SHARED = (
    "init",
    "loader",
    "ddp",
    "shard",
    "optim",
    "load",
    "load_state",
    "set_epoch",
    "coll",
    "spawn",
    "pass",
    "eval",
)
# the records that mark a rank's last exchange with the others: after it, what it does is its own
SYNC = ("coll", "step")


def exchanges(e):
    """Whether the record is an exchange with the other ranks: a collective, an optimizer step (its
    all-reduce), a forward through DDP that syncs the model's buffers."""
    return e["e"] in SYNC or (e["e"] == "eval" and e.get("through") == "ddp")


@dataclass(frozen=True)
class Divergence:
    """Where the ranks' shared calls first part: the place in each rank's sequence, each rank's call
    there (its record, or None where its sequence ended), and the ranks whose call there no other rank
    makes at all, later or ever (what they did alone: the cause, where it is a call that changes what
    the ranks share)."""

    index: int
    calls: dict  # rank: its record at index, or None
    alone: dict  # rank: its record that no other rank makes

    @property
    def kinds(self):
        return {e["e"] for e in self.alone.values()}


def token(e, world):
    """What of a shared call must be alike on every rank: its kind, its line, and what it was told."""
    kind = e["e"]
    if kind == "coll":
        if e.get("group") is not None and len(e["group"]) != world:
            return None  # a collective of some ranks' own group
        return kind, e["name"], e["at"]
    if kind == "load":
        return kind, e["at"], os.path.basename(e["path"] or "")
    if kind == "set_epoch":
        return kind, e["at"], e["epoch"]
    if kind == "pass":
        return kind, e["loader"]
    if kind == "eval":  # a forward without gradients is shared where it is a collective (DDP's)
        return (kind, e["at"]) if e.get("through") == "ddp" else None
    return kind, e.get("at")


def shared_calls(events, world, training):
    """A rank's shared calls, up to its last exchange with the other ranks: (token, record) pairs."""
    last = max((i for i, e in enumerate(events) if exchanges(e)), default=-1)
    calls = []
    for e in events[: last + 1]:
        if e["e"] not in SHARED or (e["e"] == "pass" and e["loader"] not in training):
            continue
        t = token(e, world)
        if t is not None:
            calls.append((t, e))
    return calls


def first_divergence(ranks, world, training):
    """The first place the ranks' shared calls differ (ranks: {rank: its records}; training: the ids of
    the loaders trained on), or None where they are alike as far as each rank went together."""
    if len(ranks) < 2:
        return None
    calls = {r: shared_calls(events, world, training) for r, events in ranks.items()}
    longest = max(map(len, calls.values()))
    for i in range(longest):
        here = {r: c[i] if i < len(c) else None for r, c in calls.items()}
        if (
            len({t for t, _ in filter(None, here.values())} | ({None} if None in here.values() else set()))
            == 1
        ):
            continue
        alone = {}
        for r, call in here.items():
            if call is None:
                continue
            others = [c for o, c in calls.items() if o != r]
            if not any(call[0] in {t for t, _ in c[i:]} for c in others):
                alone[r] = call[1]
        return Divergence(i, {r: call and call[1] for r, call in here.items()}, alone)
    return None


def call_said(e, code):
    """One rank's shared call, as a finding says it (code: file:line as evidence)."""
    kind = e["e"]
    if kind == "set_epoch":
        return f"set_epoch({e['epoch']}) at {code(e['at'])}"
    if kind == "coll":
        return f"dist.{e['name']}() at {code(e['at'])}"
    if kind == "pass":
        return "a pass over the training data"
    if kind == "load":
        return f"torch.load of {os.path.basename(e['path'] or '') or 'a file'} at {code(e['at'])}"
    what = {
        "load_state": "load_state_dict()",
        "ddp": "DDP(...)",
        "shard": "fully_shard()",
        "optim": "an optimizer",
    }
    return f"{what.get(kind, kind)} at {code(e.get('at'))}"


def divergence_said(d, code):
    """Where the ranks part, as a finding says it: each rank's call there, or that it had none."""
    return "; ".join(
        f"rank {r} {'made ' + call_said(e, code) if e else 'made no such call'}"
        for r, e in sorted(d.calls.items())
    )


def without(ranks, gone):
    """The ranks' records less the records in gone (by identity): what they did besides."""
    ids = {id(e) for e in gone}
    return {r: [e for e in events if id(e) not in ids] for r, events in ranks.items()}
