"""DDP step 6: checkpoint on rank 0.

Its rules, in the order they are tried (ORDER), and its summary. A rule's docstring is its
explanation (python check_ddp.py --explain CODE): its first line the summary; then what happens,
why, and what to do."""

import os
import re

from ..judge.crash import COMMUNICATION_ERROR
from ..judge.divergence import call_said, divergence_said, first_divergence, without
from ..judge.evidence import once_per_node, out_of_step, per_node_finding, written_once_per_node
from ..judge.registry import Found, rule, summary
from ..judge.words import both, plural, ranks_text, short


@rule(
    "DDP615",
    "FAIL",
    explains=("crash", "hang"),
    help="load the checkpoint on every rank, before the DDP wrap (map_location= its own device): the same "
    "weights, optimizer state and epoch everywhere",
)
def loaded_by_some_ranks(f):
    """Some ranks loaded a checkpoint the others did not: the ranks resume from different states.

    Each rank holds its own replica, its own optimizer and its own count of epochs. A resume that runs
    on rank 0 alone (`if rank == 0: load...`) gives rank 0 the checkpoint's weights, optimizer state
    and epoch, and leaves the other ranks as a fresh start leaves them: DDP's wrap sends them rank 0's
    weights, and nothing else. From there the ranks train other epochs with other optimizer states:
    they part (one waits in a collective another never joins), or end with different replicas. Every
    rank loads the same checkpoint, before the wrap: this is the first place the ranks' calls part,
    and what differs after it follows from it. (Loaded on rank 0 alone before the wrap, with no
    effect after it, as the weights of a pretrained model DDP then sends everywhere, it is no finding.)
    """
    d = f.divergence
    if d is None or not d.alone or not d.kinds <= {"load", "load_state"}:
        return None
    loaded = sorted(d.alone)
    others = sorted(set(f.job.ranks) - set(loaded))
    if not others:
        return None
    gone = [e for r in loaded for e in f.job.ranks[r] if e["e"] in ("load", "load_state") and e is not None]
    gone = [e for e in gone if any(e is x for x in d.alone.values()) or alone_load(f, e, others)]
    after = first_divergence(without(f.job.ranks, gone), f.world, set(f.training_loaders))
    crashed = f.crash is not None and COMMUNICATION_ERROR.search(f.crash[1]["message"])
    effects = []
    if after is not None:
        effects.append(f"then the ranks part: {divergence_said(after, f.code)}")
    if f.weights_differ:
        effects.append(f"the replicas differ at the end ({f.weights_differ})")
    if crashed:
        effects.append(f"rank {f.crash[0]} lost its peers ({short(f.crash[1]['message'])})")
    elif f.job.hung:
        effects.append("the job hung")
    if not effects:
        return None  # as DDP's wrap made it: nothing of it reached the ranks apart
    e = next((x for x in gone if x["e"] == "load"), gone[0])
    what = call_said(e, f.code)
    return Found(
        f"{ranks_text(loaded)} alone made {what}, and {ranks_text(others)} did not: " + "; ".join(effects),
        explains=("crash", "hang") if crashed or f.job.hung else (),
        follows_across=f"{ranks_text(loaded)} alone loaded a checkpoint, at {e['at']}",
    )


def alone_load(f, e, others):
    """Whether no other rank made this load (its line) at all."""
    return not any(x["e"] == e["e"] and x.get("at") == e.get("at") for r in others for x in f.job.ranks[r])


@rule(
    "DDP609",
    "FAIL",
    hang=True,
    across=True,
    see="rank_zero_collective",
    help="take the collective out of the rank-only block: every rank must call it",
)
def collective_in_rank_block(f):
    """A collective inside a rank-only block (if rank == 0:): the other ranks never reach it.

    A collective (all_reduce, barrier, broadcast, and DDP's own, in forward and backward)
    returns only once every rank has called it. Called inside `if rank == 0:`, it waits forever
    for ranks that took the other branch; they meanwhile wait in their next collective. Or the
    two meet, out of step: on gloo, rank 0's call and another rank's next one (DDP's gradient
    all-reduce) exchange tensors of different sizes, and the job aborts ("Received data size
    doesn't match expected size"). Take the collective out of the block: every rank calls it,
    and only the writing stays on rank 0.
    """
    found = out_of_step(f, "rank_block")
    unmatched = f.unmatched_collective
    gathers = {"get_model_state_dict", "get_optimizer_state_dict", "get_state_dict", "set_model_state_dict",
               "set_optimizer_state_dict", "set_state_dict"}  # fmt: skip
    named = {c["name"] for c in (unmatched[1].values() if unmatched else ()) if c}
    if found and named & gathers:
        found.see = "full_state_dict_rank_zero"  # a sharded model's state gathered in it: FSDP's pitfall
    elif found and any(name.startswith("dcp.") for name in named):
        found.see = (
            "sharded_state_dict"  # a sharded checkpoint saved on some ranks: every rank writes its own
        )
    return found


@rule(
    "DDP614",
    "FAIL",
    see="sharded_state_dict",
    help="gather the full state dict on every rank (get_model_state_dict(model, options=StateDictOptions("
    "full_state_dict=True, cpu_offload=True))), and save it on rank 0; or save every rank's shards with "
    "torch.distributed.checkpoint",
)
def sharded_state_dict_saved(f):
    """A checkpoint holds a sharded model's state_dict(): DTensors, this rank's shards, not the model.

    A sharded model's state_dict() gives each rank's own shards, as DTensors: the full shapes, and
    only this rank's rows. Saved by one rank, the file holds a part of each parameter, which neither
    the single-GPU script (torch.load refuses DTensors with weights_only=True) nor the same job (the
    other ranks' rows are lost) can load. Gather the full state dict on every rank, a collective, and
    save it on rank 0; or save every rank's shards with torch.distributed.checkpoint.
    """
    for _, e in f.saved_files:
        if e["what"].get("sharded"):
            n = e["what"]["sharded"]
            return Found(
                f"{f.job.relpath(f.renamed.get(e['path'], e['path']))} saved at {f.code(e['at'])} holds "
                f"{plural(n, 'DTensor')}: the shards of the rank that saved it, not the model"
            )
    return None


@rule(
    "DDP611",
    "warn",
    explains=("crash",),
    help="save plain data in a checkpoint: tensors, numbers, strings, and lists and dicts of them "
    "(vars(args), not args; float(x), not a numpy number); or load inside "
    "torch.serialization.safe_globals([...]), naming what it holds",
)
def resume_cannot_load(f):
    """A checkpoint the script's own torch.load refuses: its resume cannot load what it saved.

    Since torch 2.6, torch.load(path) loads with weights_only=True: tensors, numbers, strings, and
    lists, tuples and dicts of them, nothing that names a class or a function to call while it
    unpickles. A checkpoint that holds more (an argparse.Namespace, a numpy number or array, an
    object of a class of the script's) saves without a word, and the resume that loads it fails with
    UnpicklingError: the run that saves never shows it, and a job restarted after a crash cannot
    continue. The check reads each saved file back as torch.load(weights_only=True) reads it, and
    finds the script's torch.load calls in its code, reached by the run or not. Save plain data, or
    load inside torch.serialization.safe_globals([...]). (One process of the script fails the same way:
    a warning, not a DDP step's FAIL.)
    """
    version = max((e.get("torch") or "0.0" for e in f.starts.values()), default="0.0")
    default = tuple(int(x) for x in re.findall(r"\d+", version)[:2]) >= (2, 6)  # weights_only's default
    if f.source.source_lines(r"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):
        return None
    allowed = " ".join(f.source.line(at) for at in f.source.source_lines(r"safe_globals\("))
    loads = f.source.calls("torch.load")
    refusing = [at for at, keywords in loads if keywords.get("weights_only", default) is True]
    if not refusing or len(refusing) < len(loads):  # a load that may take it: the resume's, perhaps
        return None
    for _, e in f.saved_files:
        names = [n for n in e["unsafe"] or () if n.rpartition(".")[2] not in allowed]
        if names and (e["what"]["models"] or e["what"]["optimizer"]):
            crashed = f.crashed_with("Weights only load failed")
            what = e["unsafe_at"] or ", ".join(names)
            return Found(
                f"{f.job.relpath(f.renamed.get(e['path'], e['path']))} saved at {f.code(e['at'])} holds "
                f"{what}, which torch.load refuses, and the script's own torch.load at {f.code(refusing[0])} "
                "loads "
                "with weights_only=True (torch's default since 2.6): the resume cannot load its own "
                "checkpoint" + (f" (rank {f.crash[0]} failed on it)" if crashed else ""),
                explains=("crash",) if crashed else (),
            )
    return None


@rule(
    "DDP601",
    "warn",
    see="unsafe_load",
    help="load with weights_only=True (the default since torch 2.6): a file anyone could have put there is "
    "a stranger's, and its pickle runs as you",
)
def unsafe_load(f):
    """torch.load(..., weights_only=False) of a file another process could have written: it runs its code.

    A checkpoint is a pickle; with weights_only=False, unpickling it may call any function it
    names. A file in a folder anyone on the machine may write to (/tmp, /dev/shm) that this job did
    not save could have been put there, or replaced, by another user's process: loading it so runs
    their code, as you, on every rank. Load with weights_only=True, and save plain data (a
    state_dict(), not the model object). A file of your own that you trust is DDP613's. (One process of
    the script runs the same code: a warning of its own, not a DDP step's FAIL.)
    """
    saved = {e["path"] for _, e in f.job.records("save")} | set(f.renamed.values())
    for _, e in f.job.records("load"):
        if e["weights_only"] is False and e["shared"] and e["path"] not in saved:
            return Found(
                f"{f.code(e['at'])} loads {e['path']} with weights_only=False, from a folder anyone on the "
                "machine may write to, and this job did not save it: loading it runs any code it names"
            )
    return None


@rule(
    "DDP602",
    "FAIL",
    see="every_rank_saves",
    launch="follows",
    help="save on global rank 0 alone: if dist.get_rank() == 0: torch.save(...) (a test of LOCAL_RANK is "
    "true once per node), with no collective inside",
)
def every_rank_saves(f):
    """Several processes save the same checkpoint file at once: every rank, or one per node.

    The replicas are equal, so one copy is all there is to save; processes writing one file at
    the same moment may leave it torn, and on a shared folder they contend for it. A save under
    `if local_rank == 0:` runs once per node: on one machine it looks right, on two it is two
    writers. Save on global rank 0 alone, dist.get_rank() == 0 (and keep any collective outside
    that block).
    """
    by_path = {}
    for rank, e in f.job.records("save"):
        by_path.setdefault(f.renamed.get(e["path"], e["path"]), {})[rank] = e
    for path, savers in sorted(by_path.items(), key=lambda item: str(item[0])):
        if path and len(savers) > 1 and not once_per_node(f, savers):
            e = next(iter(savers.values()))
            nodes = {f.starts[r]["node"] for r in savers}
            if (
                len(nodes) == len(savers)
                and {f.local_rank(r) for r in savers} == {0}
                and len(savers) < f.world
            ):
                who = f"{ranks_text(savers)}, local rank 0 of each node,"
            elif len(nodes) == len(savers) == f.job.nnodes > 1:
                who = f"{ranks_text(savers)}, one on each node,"
            else:
                who = f"{ranks_text(savers)} {both(savers)}"
            return Found(
                f"{who} saved {f.job.relpath(path)} at {f.code(e['at'])}: several processes write the same "
                "file at once (on a shared folder, one per node at the least)"
            )
    return None


@rule(
    "DDP612",
    "FAIL",
    launch="follows",
    explains=("crash",),
    help="make the folder and write the file on global rank 0 alone (if dist.get_rank() == 0:), or give each "
    "rank a path of its own; os.makedirs(path, exist_ok=True) where every rank needs the folder",
)
def ranks_race_for_a_path(f):
    """Several ranks make or write one path at once, and one of them fails on it.

    The second rank to call os.makedirs(path) finds it taken (FileExistsError); a file one rank
    renames into place, or removes, is gone when another reaches for it (FileNotFoundError). Which
    rank fails is the luck of the moment: a job that ran once fails the next time, or on another
    file system, wherever it happens to be (saving, evaluating). Make folders and write files on
    global rank 0 alone, or give each rank a path of its own.
    """
    if not f.crash or not f.crash[1]["path"]:
        return None
    rank, e = f.crash
    touched = {}
    for r, w in f.job.records("write"):
        if w["path"] == e["path"]:
            touched.setdefault(r, w)
    if len(touched) < 2 or once_per_node(f, touched):
        return None
    first = touched[min(touched)]
    return Found(
        f"{ranks_text(touched)} {both(touched)} make or write {f.job.relpath(e['path'])} at "
        f"{f.code(first['at'])}: rank {rank} failed on it ({e['type']}: {short(e['message'])})"
    )


@rule(
    "DDP610",
    "FAIL",
    launch="follows",
    help="write the file from one rank (if dist.get_rank() == 0:), or name one file per rank",
)
def several_ranks_overwrite(f):
    """Several ranks write the same file over (a log, settings, results): it ends torn, or as one rank's.

    Each process opens the file to write it whole, at about the same moment: they truncate each
    other's work, and what is left is one rank's, or a mix. On several nodes sharing a folder, a
    guard on the local rank still leaves one writer per node. Write from global rank 0 alone, or
    give each rank a file of its own. (Ranks that open it and write nothing into it, as every rank
    clearing a log that rank 0 alone then fills, write nothing over: a rank counts as writing a file
    when it appended to it, or its handle's position, as the system counts it, or the file's size
    says it wrote into it.)
    """
    saved = {f.renamed.get(e["path"], e["path"]) for _, e in f.saved_files} | {
        e["path"] for _, e in f.saved_files
    }
    writers = {}
    for rank, e in f.job.records("write"):
        path = e["path"]
        if e["mode"] == "overwrite" and path not in saved | f.empty_files and f.wrote_into(rank, path):
            writers.setdefault(f.renamed.get(path, path), {})[rank] = e
    for path, by in sorted(writers.items()):
        if len(by) > 1 and not once_per_node(f, by):
            e = next(iter(by.values()))
            return Found(f"{ranks_text(by)} {both(by)} wrote {f.job.relpath(path)} over at {f.code(e['at'])}")
    return None


@rule(
    "DDP616",
    "warn",
    sets_aside=("layout",),
    help="write it on global rank 0 alone: if dist.get_rank() == 0: (a test of LOCAL_RANK is true once per "
    "node)",
)
def file_written_once_per_node(f):
    """A file is written once per node (under `if local_rank == 0:`): on nodes that share a disk, at once.

    A test of the local rank is true on one process of each node. On one machine it guards one writer;
    on several that share a disk (most clusters' home and scratch folders), each node's local rank 0
    writes the same checkpoint or log at the same moment, and the file ends torn, or as one node's. A
    risk of several machines, not of this one: said as a warning (the rehearsed nodes share this
    machine's disk). Write on global rank 0 alone.
    """
    return per_node_finding(f, before_training=False)


@rule("DDP603", "warn", see="wrapped_state_dict", help="save model.module.state_dict(), the model DDP wraps")
def wrapped_state_dict(f):
    """The checkpoint holds the DDP wrapper's state_dict(): every key starts with module.

    DDP keeps the model as its attribute module, so its state_dict() prefixes every key with
    "module.". Only a DDP-wrapped model loads that: the baseline, an evaluation script, a
    single-GPU run fail with missing and unexpected keys. (If the script itself loads it into a
    bare model, that load fails, and the report shows the error.) Save model.module.state_dict().
    """
    for _, e in f.saved_files:
        if e["what"]["module_prefix"] and not f.reloads_wrapped:
            return Found(
                f"the model keys saved at {f.code(e['at'])} start with module.: the state_dict() of the DDP "
                "wrapper, which only a DDP model loads"
            )
    return None


@rule(
    "DDP608",
    "warn",
    see="wrapped_state_dict",
    help="save model.module.state_dict(), and load it into model.module (or before wrapping): then any "
    "script and any world size loads it",
)
def wrapped_state_dict_reloaded(f):
    """The checkpoint holds module. keys, which the script loads back into its DDP model: for it alone.

    The script saves the DDP wrapper's state_dict() and loads it into a DDP model again, so its
    own resume works. Nothing else can load the file as it is: the baseline, an evaluation
    script, the bare model. Save and load model.module's state instead.
    """
    for _, e in f.saved_files:
        if e["what"]["module_prefix"] and f.reloads_wrapped:
            at = f.reloads_wrapped
            return Found(
                f"the model keys saved at {f.code(e['at'])} start with module., and the script loads them "
                f"back into its DDP model at {f.code(at)}: its own resume works, nothing else loads the file"
            )
    return None


@rule("DDP604", "FAIL", see="wrapped_state_dict", help="save model.module.state_dict()")
def pickles_wrapper(f):
    """The checkpoint pickles the DDP wrapper itself.

    torch.save(model) of a DDP model pickles the wrapper, with its process group: loading it
    needs the same classes, a process group, and weights_only=False. Save the state_dict() of
    the model DDP wraps.
    """
    for _, e in f.job.records("save"):
        if e["what"]["module"] == "DistributedDataParallel":
            return Found(f"{f.code(e['at'])} pickles the DDP wrapper itself")
    return None


@rule(
    "DDP605",
    "warn",
    help="write files from one rank (if dist.get_rank() == 0:), or one file per rank",
)
def several_ranks_write(f):
    """A file other than a checkpoint is written by more than one rank.

    Several processes writing one log or metrics file interleave their lines, or overwrite each
    other's. Write from one rank, or name one file per rank.
    """
    writers = {}
    for rank, e in f.job.records("write"):
        if e["how"] != "os.mkdir" and e["path"] not in f.empty_files and f.wrote_into(rank, e["path"]):
            writers.setdefault(e["path"], {})[rank] = e
    for path, by in sorted(writers.items()):
        if len(by) > 1 and not once_per_node(f, by):
            e = next(iter(by.values()))
            return Found(f"{ranks_text(by)} {both(by)} wrote {f.job.relpath(path)} at {f.code(e['at'])}")
    return None


@rule(
    "DDP606",
    "warn",
    see="compile_order",
    help="save the bare model's state_dict(): keep a reference to it before torch.compile",
)
def compiled_state_dict(f):
    """The checkpoint's keys start with _orig_mod.: a compiled model's, which only a compiled model loads.

    torch.compile wraps the model, and the wrapper's state_dict() prefixes every key with
    "_orig_mod.". Keep a reference to the bare model and save its state_dict().
    """
    saves = f.saved_files
    if any(s["what"]["orig_mod_prefix"] for _, s in saves):
        return Found(
            f"the model keys saved at {f.code(saves[0][1]['at'])} start with _orig_mod.: a compiled model's, "
            "which only a compiled model loads"
        )
    return None


@rule("DDP607", "warn", help="save optimizer.state_dict() too (and the epoch), and load both to resume")
def no_optimizer_state(f):
    """The checkpoint holds no optimizer state: training cannot resume exactly from it.

    Momentum and Adam's moments live in the optimizer. A run resumed from the weights alone
    restarts them from zero, and trains differently from one that never stopped. Save
    optimizer.state_dict() (and the epoch) with the model, and load both. (A file that holds no model's
    weights, a vocabulary or a config saved with torch.save, is no checkpoint.)
    """
    saves = [(r, s) for r, s in f.saved_files if s["what"]["models"] or s["what"]["module"]]
    if saves and not any(s["what"]["optimizer"] for _, s in saves):
        return Found(
            f"the checkpoint saved at {f.code(saves[0][1]['at'])} holds no optimizer state: training cannot "
            "resume exactly from it"
        )
    return None


@rule(
    "DDP613",
    "warn",
    see="unsafe_load",
    help="load with weights_only=True where the file holds plain data; where it must be False, load only "
    "files you wrote, and say so: # check_ddp: ignore[DDP613]",
)
def trusted_load_runs_code(f):
    """torch.load(..., weights_only=False): the file's pickle may run code; a choice, for a file you trust.

    With weights_only=False, unpickling may call any function the file names. For a checkpoint
    the script wrote itself, or a pretrained file it ships with, that is a choice with a risk, as a
    linter's security rules treat it: a warning, not a broken step. It is DDP601 where the file sits
    in a folder anyone may write to. Save plain data and load with
    weights_only=True; or keep False for your own files, and say so with `# check_ddp:
    ignore[DDP613]` on the line.
    """
    for _, e in f.job.records("load"):
        if e["weights_only"] is False:
            return Found(
                f"{f.code(e['at'])} loads with weights_only=False: unpickling it may run code it names"
            )
    for at, keywords in f.source.calls("torch.load"):
        if keywords.get("weights_only") is False:
            return Found(
                f"{f.code(at)} loads with weights_only=False (not reached in this run): unpickling it may "
                "run code it names"
            )
    return None


@summary(6)
def step_6_summary(f):
    per_node = set(written_once_per_node(f))  # the data prepared once per node: step 3's
    saves = [(r, s) for r, s in f.saved_files if f.renamed.get(s["path"], s["path"]) not in per_node]
    sharded = sharded_saves_said(f)
    if sharded and not saves:
        return "ok", sharded
    if not saves:
        made = {e["at"] for _, e in f.job.records("save")}
        unreached = [at for at, _ in f.source.calls("torch.save") if at not in made]
        if unreached:
            return "--", f"not checked: no rank reached the torch.save() at {', '.join(unreached[:3])}"
        return "--", "not checked: the script saved nothing with torch.save()"
    names = sorted({os.path.basename(f.renamed.get(s["path"], s["path"]) or "?") for _, s in saves})
    shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
    ranks = sorted({r for r, _ in saves})

    # what the files hold, as recorded: a finding silenced (ignore[DDP603]) leaves its fact standing
    def holds(key):
        return any(s["what"][key] for _, s in saves)

    held = " and ".join(name for name, key in (("model", "models"), ("optimizer", "optimizer")) if holds(key))
    prefix = "keys with the wrapper's module. prefix" if holds("module_prefix") else "no module. prefix"
    return "ok", (
        (f"{sharded}; and " if sharded else "")
        + f"{ranks_text(ranks)} {'alone ' if len(ranks) == 1 else ''}saved {shown} at {saves[0][1]['at']}: "
        f"{held + ' state' if held else 'no model or optimizer state'}, {prefix}"
    )


def sharded_saves_said(f):
    """The sharded checkpoints every rank saved (torch.distributed.checkpoint), as the step's line says
    them: where, and whether their metadata covers each tensor whole (what any world size loads)."""
    saves = [(r, e) for r, e in f.job.records("coll") if e["name"] in ("dcp.save", "dcp.async_save")]
    if not saves or {r for r, _ in saves} != set(f.job.ranks):
        return None
    e = saves[0][1]
    covered = next(
        (x["dcp"].get(e["path"]) for _, x in f.job.records("exit") if x["dcp"] and e["path"]), None
    )
    folder = f" into {f.job.relpath(e['path'])}" if e["path"] else ""
    said = f"every rank saved its shards with {e['name']}() at {e['at']}{folder}"
    if covered:
        tensors, whole = covered
        said += (
            f", its {plural(tensors, 'tensor')} whole in their chunks: a resume at any world size loads it"
            if whole == tensors
            else f", {whole} of its {plural(tensors, 'tensor')} whole in their chunks"
        )
    return said
