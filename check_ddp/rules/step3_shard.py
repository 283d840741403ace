"""DDP step 3: shard the data.

Its rules, in the order they are tried (ORDER), and its summary. A rule's docstring is its
explanation (python check_ddp.py --explain CODE): its first line the summary; then what happens,
why, and what to do."""

import itertools

from ..judge.evidence import datasets_differ, out_of_step, own_parts, per_node_finding, whole_passes
from ..judge.registry import Found, rule, summary
from ..judge.words import ordinal, plural, ranks_text


@rule(
    "DDP307",
    "FAIL",
    hang=True,
    across=True,
    see="uneven",
    help="give every rank as many batches: DistributedSampler (it pads, or drops with drop_last=True), or "
    "run the loop inside torch.distributed.algorithms.join.Join([model])",
)
def uneven_inputs(f):
    """Uneven inputs: the ranks have different numbers of batches an epoch, and DDP waits for the first done.

    Every backward() through DDP all-reduces with every rank. A rank with fewer batches leaves
    the loop first; the others wait in their next all-reduce for a rank that never comes (or,
    on gloo, fail on mismatched sizes). Give every rank as many batches (DistributedSampler pads
    or drops to make them equal), or train inside Join([model]), which lets ranks finish apart.
    """
    return out_of_step(f, "uneven")


@rule(
    "DDP309",
    "FAIL",
    help="download on global rank 0 alone, then dist.barrier(), then build the dataset on every rank "
    "(download=False): if dist.get_rank() == 0: MNIST(root, download=True); dist.barrier()",
)
def every_rank_downloads(f):
    """Every rank downloads the data into one folder at once (download=True, on every rank).

    A dataset made with download=True fetches its files when they are missing. Made on every rank at
    the start of a job, it is fetched N times at once into one folder: the processes write the same
    archive over each other, and a rank that finds a file half-written reads a broken dataset (or
    fails on it). Download on global rank 0 alone, barrier, then let every rank read the files. (Read
    from the script's code: the call whose download=True no test of the rank guards.)
    """
    if f.world < 2 or not f.job.records("step"):
        return None
    ran = {e["dataset"] for loader in f.loaders.values() for e in loader["made"].values()}
    calls = [at for at, made in f.source.keyword_calls("download", True) if made in ran]  # of data trained on
    guarded = [at for at in calls if f.source.rank_condition(at)]
    unguarded = [at for at in calls if not f.source.rank_condition(at)]
    if unguarded and not guarded:  # one on rank 0 first (then a barrier) makes the others a read
        return Found(
            f"{f.code(unguarded[0])} downloads with download=True on every rank: the {f.world} ranks fetch "
            "the data into one folder at once"
        )
    return None


@rule(
    "DDP301",
    "FAIL",
    see="unseeded",
    help="give each rank its own part of the data: a DistributedSampler, or batches drawn from a generator "
    "seeded by rank",
)
def same_batches_without_loader(f):
    """Every rank trained on the very same batches, drawn without a DataLoader.

    DDP averages the ranks' gradients: if every rank computes them on the same batch, the
    average is that one batch's gradient, and N processes do the work of one. Each rank must
    see its own part of the data.
    """
    if f.training_loaders:
        return None
    inputs = {r: e["inputs"] for r, e in f.job.records("exit") if e["inputs"]}
    if len(inputs) == f.world > 1:
        n = min(map(len, inputs.values()))
        if n and len({tuple(v[:n]) for v in inputs.values()}) == 1:
            return Found(
                f"every rank trained on the very same batches ({n} steps compared; the script draws its "
                "batches without a DataLoader)"
            )
    return None


@rule(
    "DDP302",
    "FAIL",
    across=True,
    see="unseeded",
    help="seed the data the same on every rank (torch.Generator().manual_seed(seed)), or build it on one "
    "rank and share it",
)
def different_datasets_sampled(f):
    """The ranks built different datasets, and a DistributedSampler shards them as if they were one.

    DistributedSampler gives rank r the indices r, r + N, r + 2N, ... of one dataset that it
    assumes is the same on every rank. If each rank draws its own (unseeded random data, a
    shuffle before the split), the shards are parts of different datasets: some samples are
    never seen, others twice. Seed the data alike on every rank, or build it once and share it.
    """
    for loader in f.training_loaders.values():
        message = datasets_differ(f, loader, splits=True)
        if message and next(iter(loader["made"].values()))["distributed"]:
            return Found(message + ", and DistributedSampler assumes it is the same on every rank")
    return None


def overlapping_shards(f):
    """The first epoch in which two ranks' shards share more samples than the sampler's padding
    can repeat: (loader, what the shards share), or None. Indices are compared only where they index
    one dataset: a rank that holds a part of its own (each its own list, of its own length) may count
    from 0 as every other does."""
    for loader in f.training_loaders.values():
        passes = whole_passes(loader)
        if len(passes) < 2 or own_parts(loader):
            continue
        some = next(iter(loader["made"].values()))
        for n in range(min(len(p) for p in passes.values())):
            drawn = {r: p[n] for r, p in passes.items()}
            # shares that overlap by design are a sampler of the script's own's (torch's DistributedSampler
            # deals disjoint shards of one dataset: where its shards overlap, the datasets differ)
            if not some["distributed"] and drawn_as_shares(drawn, some["length"], f.world):
                continue
            if not some["distributed"] and repeats_within_a_rank(drawn) and not drawn_alike(drawn):
                continue  # what one process of it shows too: a stream that draws a sample twice in a pass
            for k, sets in enumerate(shards_of_a_pass(f, drawn, some["length"])):
                ranks = sorted(sets)
                shared = max(len(sets[a] & sets[b]) for a in ranks for b in ranks if a < b)
                if shared <= f.world - 1:  # no more than DistributedSampler's padding can repeat
                    continue
                length = some["length"]
                when = (
                    f"epoch {n + 1}"
                    if not k
                    else f"the {ordinal(k + 1)} pass over the data of a never-ending stream"
                )
                if all(sets[r] == sets[ranks[0]] for r in ranks) and length and len(sets[ranks[0]]) >= length:
                    what = f"{ranks_text(ranks)} each drew all {length} samples in {when}"
                else:
                    what = (
                        f"in {when} the shards of {ranks_text(ranks)} share {shared} of their "
                        f"{min(len(s) for s in sets.values())} samples"
                    )
                return (
                    loader,
                    f"{what} (DataLoader at {f.code(some['at'])}): each rank trains on the same data",
                )
    return None


def repeats_within_a_rank(drawn):
    """Whether a rank drew a sample twice in one pass: a sampler that streams (a shuffle buffer, a
    window, draws with replacement) does so in one process alone too. Samples its ranks share are then
    its way of drawing, not data left unsharded: only ranks that draw alike train on the same data."""
    return any(len(set(indices)) < len(indices) for indices in drawn.values())


def drawn_alike(drawn):
    """Whether every rank drew the very same samples in a pass."""
    sets = [set(indices) for indices in drawn.values()]
    return all(s == sets[0] for s in sets)


def drawn_as_shares(drawn, length, world):
    """Whether each rank drew a share of the data of its own, as a sampler that shards by rank does: no
    more draws than the data's size / N, and no two ranks alike. Shares that overlap are then the
    sampler's design (repeated augmentation deals a sample to several ranks, each to augment it its own
    way), not unsharded data: with no DistributedSampler each rank draws the whole data; ranks told the
    wrong world (num_replicas=1) draw it whole too, or alike."""
    sequences = [tuple(indices) for indices in drawn.values()]
    share = -(-(length or len(set().union(*sequences))) // max(1, world))
    return len(set(sequences)) == len(sequences) and all(len(s) <= share for s in sequences)


def shards_of_a_pass(f, drawn, length):
    """Each rank's shards of one pass, as sets, to compare between ranks: the pass itself, or, for a
    sampler that never ends (a pass over many epochs' worth of data, as detectron2's and DINO's
    stream indices), its consecutive windows of one epoch's share each, the data's size / N."""
    size = length or len(set().union(*map(set, drawn.values())))
    share = -(-size // max(1, f.world))
    if not share or max(map(len, drawn.values())) <= size + f.world:  # no more than the data: an epoch
        return [{r: set(d) for r, d in drawn.items()}]
    windows = min(len(d) for d in drawn.values()) // share
    return [{r: set(d[k * share : (k + 1) * share]) for r, d in drawn.items()} for k in range(windows)]


def sampler_misconfigured(f, loader):
    made = loader["made"]
    distributed = next(iter(made.values()))["distributed"]
    return distributed and (
        distributed["num_replicas"] != f.world
        or len({made[r]["distributed"]["rank"] for r in made}) < len(made)
    )


@rule(
    "DDP303",
    "FAIL",
    across=True,
    launch="follows",
    help="pass sampler=DistributedSampler(dataset) to the DataLoader, and drop shuffle=True (the sampler "
    "shuffles); call sampler.set_epoch(epoch) each epoch",
)
def no_distributed_sampler(f):
    """The ranks' shards overlap: each rank trains on the same data, with no DistributedSampler.

    A DataLoader with shuffle=True (or a plain sampler) gives every rank the whole dataset: N
    processes each go over all of it, and DDP averages gradients of the same samples. A
    DistributedSampler gives each rank its own shard, 1/N of the data.
    """
    found = overlapping_shards(f)
    if found and not sampler_misconfigured(f, found[0]):
        return Found(found[1])
    return None


@rule(
    "DDP304",
    "FAIL",
    across=True,
    launch="follows",
    help="leave num_replicas= and rank= out of DistributedSampler(...): the group knows them",
)
def sampler_told_wrong_world(f):
    """The ranks' shards overlap: their DistributedSampler was told a world that is not the group's.

    DistributedSampler(dataset) reads the world size and the rank from the process group. Passed
    by hand (num_replicas=1, rank=0, or a local rank on several nodes), they make ranks draw the
    same shard. Leave them out.
    """
    found = overlapping_shards(f)
    if found and sampler_misconfigured(f, found[0]):
        return Found(found[1])
    return None


@rule(
    "DDP305",
    "FAIL",
    see="set_epoch",
    help="call sampler.set_epoch(epoch) at the start of each epoch, on every rank",
)
def same_order_every_epoch(f):
    """The sampler shuffles once per job: sampler.set_epoch(epoch) is never called (or always alike).

    DistributedSampler seeds its shuffle with seed + epoch, and its epoch stays 0 until
    set_epoch() changes it: every epoch then visits the samples in the same order, in the same
    batches, which trains worse than a new shuffle each epoch. Call sampler.set_epoch(epoch) at
    the start of each epoch, on every rank.
    """
    for loader in f.training_loaders.values():
        passes = whole_passes(loader)
        if len(passes) < 2:
            continue
        orders = passes[min(passes)]
        if len(orders) >= 2 and orders[0] != sorted(orders[0]) and all(o == orders[0] for o in orders[1:]):
            set_epochs = [e for _, e in f.job.records("set_epoch")]
            told = f" (set_epoch always got {set_epochs[0]['epoch']})" if set_epochs else ""
            at = next(iter(loader["made"].values()))["at"]
            return Found(
                f"rank {min(passes)} drew the same order in each of its {len(orders)} epochs{told}: "
                f"the shuffle happens once per job (DataLoader at {f.code(at)})"
            )
    return None


@rule(
    "DDP306",
    "warn",
    across=True,
    see="unseeded",
    help="if the data is random, seed it the same on every rank",
)
def different_datasets(f):
    """The ranks built different datasets (fine if each rank loads its own shard on purpose).

    Each rank's DataLoader holds other data. With no DistributedSampler that may be meant (each
    rank reads its own files), but if the data is random and unseeded, the ranks train on
    datasets that were never meant to differ. Seed it alike on every rank.
    """
    for loader in f.training_loaders.values():
        message = datasets_differ(f, loader)
        if message:
            return Found(message + " (fine if each rank loads its own shard on purpose)")
    return None


@rule(
    "DDP308",
    "warn",
    sets_aside=("layout",),
    help="prepare the data on global rank 0 alone (if dist.get_rank() == 0:), then dist.barrier(); or, where "
    "each node has a disk of its own, keep it there (a path on the node's own disk)",
)
def data_prepared_once_per_node(f):
    """The data is prepared once per node (under `if local_rank == 0:`): on nodes that share a disk, at once.

    `if local_rank == 0: download(); dist.barrier()` makes the data once on each node. On a cluster whose
    nodes each have a disk of their own that is right; where they share one (a network file system,
    as most clusters' home and scratch folders are), each node's local rank 0 writes the same files at
    the same moment, and a rank may read a file another node is still writing. A risk of several
    machines, not of this one: said as a warning. Where the rehearsed nodes' writes tore a file and
    stopped the job, the rest is checked again as one node. Prepare it on global rank 0 alone, then
    barrier; or write it to each node's own disk.
    """
    return per_node_finding(f, before_training=True)


@summary(3)
def step_3_summary(f):
    if not f.training_loaders:
        inputs = {r: e["inputs"] for r, e in f.job.records("exit") if e["inputs"]}
        if len(inputs) == f.world > 1:
            return "--", (
                "not checked whether the shards cover the data: the script draws its batches "
                "without a DataLoader (its ranks' batches do differ)"
            )
        return "--", "not checked: no DataLoader gave batches to training"
    for loader in f.training_loaders.values():
        passes = whole_passes(loader)
        if len(passes) < 2:
            continue
        some = next(iter(loader["made"].values()))
        orders = passes[min(passes)]
        longest = max(map(len, orders), default=0)
        if not longest:
            continue  # passes whose indices the check did not see
        how = "DistributedSampler" if some["distributed"] else some["sampler"]
        first = {r: p[0] for r, p in passes.items() if p}
        shared = max((len(set(a) & set(b)) for a, b in itertools.combinations(first.values(), 2)), default=0)
        repeats = 0  # samples the sampler draws again to even the shards: then they are not disjoint
        if (
            shared > f.world - 1
            and not some["distributed"]
            and drawn_as_shares(first, some["length"], f.world)
        ):
            detail = (
                f"{how}: shares of {longest} draws a rank that overlap by the sampler's design, each rank's "
                "its own (repeated augmentation: each copy augmented anew)"
            )
        elif shared and not some["distributed"] and repeats_within_a_rank(first):
            again = max(len(p) - len(set(p)) for p in first.values())
            detail = (
                f"{how}: {longest} draws a rank, each rank's its own, which repeat samples within a pass as "
                f"one process of it does too (up to {again} a rank)"
            )
        else:
            repeats = sum(len(set(p)) for p in first.values()) - len(set().union(*first.values()))
            detail = f"{how}: {'shards' if repeats else 'disjoint shards'} of {longest} samples a rank"
        if some["length"]:
            detail += f", of {some['length']}"
        if repeats:
            detail += f", {plural(repeats, 'sample')} drawn again by another rank"
        if len(orders) >= 2:
            detail += ", a new order each epoch" if orders[0] != orders[1] else ""
        else:
            detail += " (one epoch: set_epoch not checked)"
        return "ok", f"{detail} (DataLoader at {some['at']})"
    return "--", "not checked"
