"""What several rules read of a job, derived once from its records: the loaders' passes, the crash that
explains the others, where each rank waits, the first collective the ranks did not call alike."""

import copy
import functools

from ..watch.collectives import REDUCING
from .crash import COMMUNICATION_ERROR, INIT
from .divergence import first_divergence
from .source import Source
from .words import by_line


def one_parent_a_node(job):
    """The job as its own launcher runs it, where the script starts its own processes (mp.spawn,
    mp.Process): each rank stands for one child, and ran the parent's part too, before its spawn. The
    parent runs once a node: its files are written once, by local rank 0's; the other ranks' writes
    before their spawn are left out. A copy: the job given is not changed."""
    spawned = {
        r: next((i for i, e in enumerate(events) if e["e"] == "spawn"), None)
        for r, events in job.ranks.items()
    }
    if not any(i is not None for i in spawned.values()):
        return job
    local = {r: e["local_rank"] for r, events in job.ranks.items() for e in events if e["e"] == "start"}
    ranks = {
        r: [
            e
            for i, e in enumerate(events)
            if not (
                local.get(r) and spawned[r] is not None and i < spawned[r] and e["e"] in ("write", "save")
            )
        ]
        for r, events in job.ranks.items()
    }
    view = copy.copy(job)
    view.ranks = ranks
    return view


class Facts:
    """A job, and what is derived from its records once, for every rule that reads it."""

    def __init__(self, job):
        self.job = one_parent_a_node(job)  # read, never written
        self.explained = frozenset()  # what the lines so far account for: "crash", "hang"
        self.lines = []  # the steps' lines so far
        self.ignored = []  # findings the script silences (# check_ddp: ignore[CODE]): (code, file:line, step)
        self.errors = []  # rules of check_ddp's own that failed on this job: "CODE: error"
        self.source = Source(job)  # the script's code, for what the records do not show
        self.code = self.source.code  # a line as evidence: file:line `its text`

    @functools.cached_property
    def unreached_launch(self):
        """Where the script starts its own processes (mp.spawn, start_processes, a Process), if it does
        and the run never got there (it stopped first, or took another path): what ran before is what
        one process does as its authors launch it. None otherwise."""
        if self.job.records("spawn"):
            return None
        names = ("spawn", "start_processes", "Process")
        launches = [at for name in names for at, _ in self.source.calls_named(name)]
        return min(launches, key=by_line) if launches else None

    @functools.cached_property
    def children_collide(self):
        """Whether processes of the job stood for the same child of the script's own launch: each
        process runs the child its LOCAL_RANK names, so that on nodes of one process each (the
        rehearsal's), every node's runs child 0, and their collectives are no one job's to compare.
        On one node, the children are the job's ranks, one each."""
        if not self.job.records("spawn"):
            return False
        local = [e["local_rank"] for e in self.starts.values()]
        return len(set(local)) < len(local)

    @functools.cached_property
    def divergence(self):
        """The first place the ranks' shared calls part (check_ddp.judge.divergence), or None."""
        return first_divergence(self.job.ranks, self.world, set(self.training_loaders))

    @functools.cached_property
    def starts(self):
        return {r: e for r, e in self.job.records("start")}

    def local_rank(self, rank):
        return self.starts[rank]["local_rank"]

    @functools.cached_property
    def standin(self):
        """Whether CUDA and NCCL were stood in on the CPU."""
        return any(e.get("standin") for e in self.starts.values())

    @functools.cached_property
    def asked_nccl(self):
        return any("nccl" in e["backend"].lower() for _, e in self.job.records("init"))

    @functools.cached_property
    def on_gpus(self):
        """Whether the script runs on GPUs: on real ones, or asked for under the stand-in."""
        if self.job.device == "cuda":
            return True
        return bool(self.job.records("gpu")) or self.asked_nccl

    @functools.cached_property
    def model_devices(self):
        """Each rank's DDP model's devices, as the script placed them (stood in: the GPUs it asked for,
        which the stand-in's record says)."""
        stood_in = {r: e["devices"] for r, e in self.job.records("ddp_gpus")}
        wrapped = [*self.job.records("ddp"), *self.job.records("shard")]
        return {r: stood_in.get(r, e["devices"]) for r, e in wrapped}

    def read(self, key):
        """Whether any rank read the launch variable key (the script, or a library for it)."""
        return any(e["key"] == key and e["found"] for _, e in self.job.records("read"))

    @functools.cached_property
    def world(self):
        return max((e["world_size"] for _, e in self.job.records("start")), default=0)

    @functools.cached_property
    def crash(self):
        """The crash that explains the others: a rank's own error before one that only reports a
        lost peer (torchrun stops the other ranks when one fails, and they may fail on its absence
        first). (rank, record), or None."""
        crashes = self.job.records("crash")
        return min(
            crashes, key=lambda c: (bool(COMMUNICATION_ERROR.search(c[1]["message"])), c[0]), default=None
        )

    @functools.cached_property
    def empty_files(self):
        """The files written that were empty at the end (a lock, a marker): nothing in them to tear. Each
        rank says which of its files were, as it ended."""
        return {path for _, e in self.job.records("exit") for path in e["empty"] or ()}

    def wrote_into(self, rank, path):
        """Whether the rank wrote anything into path: it appended to it, renamed a file into place there,
        or, having opened it to write over, wrote into it as far as its end's record knows (only what
        it is known to have left empty, it did not write)."""
        events = [e for _, e in self.job.records("write", rank=rank) if e["path"] == path]
        if any(e["mode"] != "overwrite" or e["how"] != "open" for e in events):
            return True
        wrote = next(
            (e["wrote"] for _, e in self.job.records("exit", rank=rank) if e["wrote"] is not None), None
        )
        return wrote is None or wrote.get(path) is None or wrote[path] > 0

    @functools.cached_property
    def refused(self):
        """Each rank's first GPU the stand-in refused, as CUDA or torch would: its gpu record."""
        found = {}
        for r, e in self.job.records("gpu"):
            if e["refused"]:
                found.setdefault(r, e)
        return found

    def crashed_with(self, text):
        return self.crash is not None and text in self.crash[1]["message"]

    @functools.cached_property
    def loaders(self):
        """For each loader (by id): its records per rank, its passes' indices per rank, and whether
        optimizer steps ran on its batches (a training loader) or none did (an evaluation loader)."""
        loaders = {}
        for rank, events in self.job.ranks.items():
            current = {}
            for e in events:
                if e["e"] == "loader":
                    new = {"made": {}, "passes": {}, "data": {}, "training": False, "evaluating": False}
                    loaders.setdefault(e["id"], new)
                    loaders[e["id"]]["made"][rank] = e
                elif e["e"] == "pass" and e["loader"] in loaders:
                    loaders[e["loader"]]["evaluating"] |= not e["grad"] or e["eval"]
                    passes = loaders[e["loader"]]["passes"].setdefault(rank, [])
                    passes.append([])
                    current[e["loader"]] = passes[-1]
                elif e["e"] == "batch" and e["loader"] in current:
                    if e["idx"] is not None:
                        current[e["loader"]].extend(e["idx"])
                    else:
                        loaders[e["loader"]]["data"].setdefault(rank, []).append(e["data"])
                elif e["e"] == "step" and e.get("loader") in loaders:
                    loaders[e["loader"]]["training"] = True
                elif e["e"] == "end" and e["loader"] in loaders and e["backward"]:
                    loaders[e["loader"]]["training"] = True  # trained on, by an optimizer of the script's own
        return loaders

    @functools.cached_property
    def training_loaders(self):
        return {i: loader for i, loader in self.loaders.items() if loader["training"]}

    @functools.cached_property
    def waiting(self):
        """Each rank's last known position: (the watched call it was in, the script's line, and
        the script's lines that led there, innermost first)."""
        found = {}
        for rank, event in self.job.records("now"):
            stack = event["stack"]
            found[rank] = (event["call"], stack[0] if stack else None, stack)
        return found

    def waiting_in(self, call):
        return sorted(r for r, (c, _, _) in self.waiting.items() if c == call)

    @functools.cached_property
    def init_failed(self):
        """What of the job's end init_process_group() accounts for: its crash, ranks waiting in it."""
        crashed = self.crash is not None and self.crash[1].get("call") == INIT
        return ("crash",) * crashed + ("hang",) * self.never_met

    @functools.cached_property
    def never_met(self):
        """The job hung with ranks still in init_process_group(): they never all met."""
        waiting = self.waiting_in(INIT)
        return bool(self.job.hung and waiting and len(self.job.records("met")) < len(self.job.ranks))

    @functools.cached_property
    def unmatched_collective(self):
        """The first collective the ranks did not call alike, each rank's collectives on the whole
        job's group compared in order: (its place in the sequences, {rank: its call there, or None});
        None where they match, or where a rank stopped on its own error (its sequence ends there)."""
        if self.children_collide or len(self.job.ranks) < 2:
            return None
        if any(not COMMUNICATION_ERROR.search(e["message"]) for _, e in self.job.records("crash")):
            return None
        sequences = {
            r: [
                e
                for e in events
                if e["e"] == "coll" and (e["group"] is None or len(e["group"]) == self.world)
            ]
            for r, events in self.job.ranks.items()
        }
        for i in range(max(map(len, sequences.values()), default=0)):
            calls = {r: s[i] if i < len(s) else None for r, s in sequences.items()}
            if len({(c["name"], c["at"]) if c else None for c in calls.values()}) > 1:
                return i, calls
        return None

    @functools.cached_property
    def weights_differ(self):
        """How the replicas' weights differ at the end ("" when they are equal; None when fewer
        than two ranks had any, or the model is sharded: each rank holds other parameters, by design)."""
        weights = {r: e["weights"] for r, e in self.job.records("exit") if e["weights"]}
        for (
            r,
            events,
        ) in self.job.ranks.items():  # a rank that loaded other weights after training: as trained
            last = max((i for i, e in enumerate(events) if e["e"] == "step"), default=None)
            trained = [e["trained"] for e in events[last or 0 :] if e["e"] == "load_state" and e["trained"]]
            if last is not None and trained:
                weights[r] = trained[0]
        if len(weights) < 2 or self.job.records("shard"):
            return None
        ranks = sorted(weights)
        base = weights[ranks[0]]
        for r in ranks[1:]:
            for key in ("sum", "squares"):
                a, b = base[key], weights[r][key]
                if abs(a - b) > 1e-6 * max(1.0, abs(a), abs(b)):
                    ours, theirs = base["sum"], weights[r]["sum"]
                    return f"rank {ranks[0]}'s weights sum to {ours:.6g}, rank {r}'s to {theirs:.6g}"
        return ""

    @functools.cached_property
    def synced_by_hand(self):
        """Whether, without DDP, the script all-reduces (its gradients) before nearly every optimizer
        step, and the replicas end equal: it does what DDP does, itself."""
        rank = min(self.job.ranks) if self.job.ranks else None
        steps = self.job.records("step", rank=rank) if rank is not None else []
        before = (
            {e["step"] for _, e in self.job.records("coll", rank=rank) if e["name"] in REDUCING}
            if steps
            else set()
        )
        ddp = self.job.records("ddp")
        return bool(steps) and not ddp and len(before) >= 0.9 * len(steps) and self.weights_differ == ""

    @functools.cached_property
    def saved_files(self):
        """The torch.save() calls that wrote a file (not a buffer in memory): (rank, record)."""
        return [(r, e) for r, e in self.job.records("save") if e["path"]]

    @functools.cached_property
    def reloads_wrapped(self):
        """Where the script loads module.-prefixed weights into a DDP model, if it does."""
        return next((e["at"] for _, e in self.job.records("load_state") if e["ddp"] and e["prefixed"]), None)

    @functools.cached_property
    def renamed(self):
        """Files written under one name, then renamed into place: the name each ended under."""
        return {
            e["source"]: e["path"] for _, e in self.job.records("write") if e["how"] != "open" and e["source"]
        }

    @functools.cached_property
    def evaluation(self):
        """The evaluation loaders, by id: passed over, no optimizer step on their batches, and a model
        evaluating over them (gradients off, or the DDP model in eval mode). A loop over a loader
        with no model, or none evaluating, is not an evaluation."""
        return {
            i: loader
            for i, loader in self.loaders.items()
            if not loader["training"] and loader["passes"] and loader["evaluating"]
        }

    @functools.cached_property
    def evaluated(self):
        """How the first evaluation loader that every rank went over was shared out: (how, loader
        id, the DataLoader's line, held-out samples, samples counted twice); how is "all" (every
        rank evaluated all of it), "unreduced" (each its shard, and no collective followed),
        "padded" or "exact". None if no evaluation loader."""
        for i, loader in self.evaluation.items():
            passes = loader["passes"]
            at = next(iter(loader["made"].values()))["at"]
            if len(passes) < self.world:
                continue
            shards = {r: p[0] for r, p in passes.items()}
            union = set().union(*map(set, shards.values()))
            total = sum(map(len, shards.values()))
            if all(set(s) == union for s in shards.values()) and self.world > 1:
                return "all", i, at, len(union), 0
            if not self.reduced_after_passes(i):
                return "unreduced", i, at, len(union), 0
            return ("padded" if total > len(union) else "exact"), i, at, len(union), total - len(union)
        return None

    @functools.cached_property
    def evaluated_alike(self):
        """Whether every rank evaluated the very same batches (what each forward without gradients
        was given, compared between ranks): then each has the whole held-out number, exact."""
        seen = [e["eval_inputs"] for _, e in self.job.records("exit")]
        return len(seen) == self.world > 1 and bool(seen[0]) and all(s == seen[0] for s in seen)

    @functools.cached_property
    def evaluated_by_hand(self):
        """Every rank evaluated without a DataLoader (forwards without gradients): (where the first
        run of them began, whether a reducing collective followed each run before the next step or
        the end), on the lowest rank; None if not every rank did, or an evaluation loader is there."""
        if self.evaluation or self.world < 2 or len({r for r, _ in self.job.records("eval")}) < self.world:
            return None
        first, pending = None, None
        for e in self.job.ranks[min(self.job.ranks)]:
            if e["e"] == "eval":
                first, pending = first or e["at"], pending or e
            elif e["e"] == "coll" and e["name"] in REDUCING:
                pending = None
            elif e["e"] in ("step", "exit") and pending:
                return pending["at"], False
        return first, True

    def reduced_after_passes(self, loader):
        """Whether, on the lowest rank, a reducing collective follows each pass over loader before
        the next pass over any loader (or the end)."""
        pending = False
        for e in self.job.ranks[min(self.job.ranks)]:
            if e["e"] == "pass":
                if pending:
                    return False
                pending = e["loader"] == loader
            elif e["e"] == "coll" and e["name"] in REDUCING:
                pending = False
            elif e["e"] == "exit" and pending:
                return False
        return True
