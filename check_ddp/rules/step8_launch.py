"""DDP step 8: launch with torchrun.

Its rules, in the order they are tried (ORDER), and its summary. A rule's docstring is its
explanation (python check_ddp.py --explain CODE): its first line the summary; then what happens,
why, and what to do."""

import json
import re

from ..judge.evidence import where_each_waits
from ..judge.registry import Found, rule, summary
from ..judge.words import ranks_text, short
from ..watch.launch import LAUNCHER_OWNED, OTHER_LAUNCHERS, READ_KEYS


@rule(
    "DDP801",
    "FAIL",
    launch="root",
    sets_aside=("launch", "layout"),  # one node, each of torchrun's processes the child it stands for
    explains=("hang",),
    help="drop the launch in the script (mp.spawn, mp.Process): run the training function once, reading "
    "RANK, LOCAL_RANK and WORLD_SIZE from the environment torchrun makes; launch with torchrun",
)
def starts_own_processes(f):
    """The script starts its own processes (mp.spawn, mp.Process) under torchrun.

    torchrun already starts one process per GPU. A script that starts its own from each of them
    makes N x N processes for a world of N, each group of which tries to meet on its own: they
    hang, or fight over the port. Run the training function once per process, reading who it
    is from the environment torchrun made. (The check starts no processes: each of torchrun's
    runs the one child it stands for, child LOCAL_RANK, in itself; the other steps report what
    that child did.)
    """
    for _, e in f.job.records("spawn"):
        return Found(
            f"{f.code(e['at'])} starts its own processes ({e['how']}): under torchrun each of the "
            f"{len(f.job.ranks)} processes is already one of the job's, and would start a job of its own "
            "(the check ran in each the one child it stands for)"
        )
    return None


def unpassed_local_rank(f):
    """--local_rank (or --local-rank), which torchrun never passes, used for what the job did:
    (its record, what its default did, {step: what of that step follows from it}). None where no
    rank used the default for anything: an option declared and never read is no mistake."""
    local = [(r, e) for r, e in f.job.records("arg") if "local" in e["option"] and not e["given"]]
    if not local or len({r for r, _ in local}) < len(f.job.ranks):
        return None
    refused = next((e for _, e in local if e["refused"]), None)
    if refused:  # the script requires it: without it, its parser refused the command line and it exited
        said = script_said(f.job)
        return (
            refused,
            [f"the script requires it, and exited ({said})" if said else "the script requires it"],
            {},
            False,
        )
    reads = {e["at"] for _, e in f.job.records("read") if e["key"] == "LOCAL_RANK" and e["found"]}
    if len({json.dumps(e["value"]) for _, e in local}) > 1 or f.source.default_from_local_rank(
        local[0][1], reads
    ):
        return None  # a default read from LOCAL_RANK (default=int(os.environ["LOCAL_RANK"])): torchrun's
    e = local[0][1]
    dest = e["option"].lstrip("-").replace("-", "_")
    if f.source.option_set(dest):
        return None  # the script sets it itself after parsing (from LOCAL_RANK, most often)
    uses = {at for at, _, _ in f.source.option_uses(dest)}
    effects, follows, crashed = [], {}, False
    gpus = [g for _, g in f.job.records("gpu") if g["at"] in uses]
    if gpus:
        effects.append(f"every rank took cuda:{gpus[0]['index']} from it ({f.code(gpus[0]['at'])})")
        follows[2] = f"every rank's GPU comes from {e['option']}, which torchrun does not pass"
    if f.crash and f.crash[1]["at"] in uses:
        r, c = f.crash
        effects.append(f"rank {r} failed with it at {f.code(c['at'])}: {c['type']}: {short(c['message'])}")
        crashed = True
    ranks = [i for _, i in f.job.records("init") if i["rank"] == e["value"] and i["at"] in uses]
    if ranks:
        effects.append(f"every rank passed rank={e['value']!r} to init_process_group() at {ranks[0]['at']}")
        follows[1] = f"the rank passed to init_process_group() is {e['option']}'s default"
    for at, text, result, saves, acts in f.source.decided_guards(dest, e["value"]):
        if acts:
            effects.append(f"`if {text}:` at {at} is {result} on every rank")
        if saves:
            where_saved = ", ".join(saves)
            effects[-1:] = [f"{effects[-1]}: no rank reaches the save at {where_saved}"] if acts else []
            follows[6] = f"no rank reaches the save at {where_saved} (`if {text}:` is {result} on every rank)"
    return (e, effects, follows, crashed) if effects else None


@rule(
    "DDP805",
    "FAIL",
    launch="root",
    sets_aside=("launcher",),  # --local_rank passed, as torch.distributed.launch passed it
    explains=("crash",),
    help="read who the process is from the environment: local_rank = int(os.environ['LOCAL_RANK']) (the old "
    "torch.distributed.launch passed --local_rank; torchrun sets LOCAL_RANK, RANK and WORLD_SIZE)",
)
def rank_from_arguments(f):
    """The script numbers its processes itself (--local_rank, --rank, its own settings), not as torchrun does.

    The old launcher, torch.distributed.launch, passed --local_rank=N to each process; torchrun
    sets LOCAL_RANK, RANK and WORLD_SIZE in the environment instead, and passes nothing. A
    --local_rank option keeps its default in every process (all on one GPU, or all believing
    they are the node's first); a --rank on the command line, or a rank the script works out
    from settings of its own (node rank x GPUs + GPU), is the same in every process: all claim
    one rank. Read who the process is from the environment.
    """
    records = f.job.records("arg")
    unpassed = unpassed_local_rank(f)
    if unpassed:
        e, effects, follows, crashed = unpassed
        got = "no rank got it" if e["refused"] else f"every rank got its default, {e['default']!r}"
        return Found(
            f"{f.code(e['at'])} reads {e['option']}, which torchrun does not pass: {got}"
            + ("" if f.read("LOCAL_RANK") else ", and no rank read LOCAL_RANK")
            + "; "
            + "; ".join(effects),
            follows=follows,
            explains=("crash",) if crashed else (),
        )
    # ranks numbered on the command line: several passed the one --rank they were all given to
    # init_process_group() (a rank taken from torchrun's LOCAL_RANK instead is step 1's: DDP106)
    inits = {r: e for r, e in f.job.records("init") if e["rank"] not in (None, -1)}
    values = {e["rank"] for e in inits.values()}
    if len(inits) > 1 and len(values) == 1:
        value = values.pop()
        option = next((a for _, a in records if "local" not in a["option"] and a["value"] == value), None)
        if option is not None:
            return Found(
                f"{f.code(option['at'])} takes the rank from {option['option']}: {ranks_text(inits)} all "
                f"passed rank={value!r} to init_process_group(), where torchrun numbers its processes in "
                "RANK",
                explains=("crash", "hang"),
            )
    return None


@rule(
    "DDP807",
    "FAIL",
    launch="root",
    sets_aside=("launcher",),  # the variables of srun, mpirun, set from torchrun's
    help="read who the process is from torchrun's variables: RANK, LOCAL_RANK, WORLD_SIZE (or support both "
    "launchers: try torchrun's first)",
)
def rank_from_another_launcher(f):
    """The script looks for who it is in another launcher's variables (mpirun's, srun's), not torchrun's.

    Open MPI's mpirun sets OMPI_COMM_WORLD_RANK, SLURM's srun sets SLURM_PROCID; torchrun sets
    RANK, LOCAL_RANK and WORLD_SIZE. A script that reads only the others finds nothing under
    torchrun: it stops, or (behind a try/except) carries on as a job of one in every process. So
    does one that stops on any other variable only its launcher sets (SLURM_CPUS_PER_TASK,
    SLURM_JOB_NODELIST), read before who the process is: with a KeyError, or with an error its own
    except handler raises for the missing variable ("not inside a SLURM job"). The check then runs it
    again as that launcher would start it, its variables set from torchrun's, and checks the other
    steps on that run.
    """
    reads = f.job.records("read")
    if any(e["key"] in ("RANK", "LOCAL_RANK") and e["found"] and e["by"] == "script" for _, e in reads):
        return None
    # MPI's module, or who the process is as another launcher says it; or any other variable of another
    # launcher's whose absence stopped the script, whatever it reads first: the KeyError it stopped with
    # ('SLURM_CPUS_PER_TASK'), or the error it raised in its own handler of that read's failure
    crash = f.crash[1] if f.crash else {}
    stopped_on = crash["message"].strip("'\"") if crash.get("type") == "KeyError" else None
    missing = [
        e
        for _, e in f.job.records("read")
        if e["by"] == "script"
        and not e["found"]
        and e["key"] not in READ_KEYS
        and (
            e["key"].startswith("import ")
            or OTHER_LAUNCHERS.fullmatch(e["key"])
            or e["key"] == stopped_on
            or (LAUNCHER_OWNED.fullmatch(e["key"]) and f.source.handled_in(e["at"], crash.get("at")))
        )
    ]
    if missing:
        e = missing[0]
        what = (
            f"imports {e['key'][len('import ') :]} (not installed here: not checked again as that launcher "
            "starts it)"
            if e["key"].startswith("import ")
            else f"looks for {e['key']}"
        )
        return Found(
            f"{f.code(e['at'])} {what}, which another launcher provides (mpirun, srun) and torchrun does "
            "not: the script never read torchrun's RANK or LOCAL_RANK",
            explains=("crash",),
        )
    return None


@rule(
    "DDP808",
    "FAIL",
    launch="root",
    help="read who each process is from torchrun: dist.init_process_group() reads RANK and WORLD_SIZE, "
    "and LOCAL_RANK picks the GPU",
)
def never_asks_who_it_is(f):
    """No process asked torchrun who it is: N copies of the same job, each unaware of the others.

    torchrun starts N processes and tells each its RANK, LOCAL_RANK and WORLD_SIZE. A script that
    reads none of them, and makes no process group (which would read them), runs the whole job
    in every process: N times the work, N checkpoints written over each other. Read them, or let
    init_process_group() read them.
    """
    job = f.job
    if len(job.ranks) < 2 or job.records("init") or not job.records("step") or job.records("spawn"):
        return None
    if any(e["key"] in ("RANK", "LOCAL_RANK", "WORLD_SIZE") and e["found"] for _, e in job.records("read")):
        return None
    numbered = f.source.identifiers(r"rank|world_size|num_replicas|nodes?$")
    if not numbered:  # no notion of processes at all: a script not converted yet, DDP step 1's (DDP104)
        return None
    first = f.unreached_launch
    if first:  # a launch of its own the run did not reach (it stopped first, or took another path)
        return Found(
            f"not checked: the script starts its own processes at {f.code(first)} (the run never got there)",
            verdict="--",
        )
    return Found(
        f"none of the {len(job.ranks)} processes read RANK, LOCAL_RANK or WORLD_SIZE, nor made a process "
        f"group: each ran the whole job as if alone, numbered by the script's own {', '.join(numbered[:3])}"
    )


@rule(
    "DDP806",
    "FAIL",
    explains=("hang",),
    help="find what the waiting rank waits for (the line above); the job's output may say more",
)
def hung_before_the_group(f):
    """The job stopped making progress before any rank made its process group.

    No rank reached init_process_group(): the script waits for something before it (a file, a
    lock, a process of its own, input on the terminal), and the check stopped it after --silence
    seconds. A job the check had to stop is never a pass. The report says where each rank was.
    """
    job = f.job
    if not job.hung or job.records("init") or "hang" in f.explained:
        return None
    return Found(
        f"the job stopped making progress ({job.silence:g} s without any) before any rank called "
        f"init_process_group(): {where_each_waits(f)}"
    )


def script_said(job):
    """The last line the script printed before torchrun's own report of its failure."""
    lines = job.output.splitlines()
    end = next(
        (i for i, line in enumerate(lines) if re.search(r"failed \(exitcode|Sending process", line)), None
    )
    lines = [
        line.strip()
        for line in lines[:end]
        if line.strip() and not re.match(r"[WIE]\d{4} |\*{5}|Setting OMP_NUM_THREADS", line)
    ]
    return lines[-1] if lines else ""


@rule(
    "DDP804",
    "FAIL",
    help="give the script its own arguments after its name (python check_ddp.py my_train.py ARGS); "
    "torchrun --standalone --nproc_per_node=2 my_train.py ARGS shows the whole error",
)
def stopped_before_training(f):
    """The script did not start under torchrun, or stopped before training, with no error of its own.

    The script ended (an argument missing, a file not found, a sys.exit) before any training
    step, and before any error the check could trace. Its last words are in the report; the
    job's output has the rest.
    """
    job = f.job
    quit_early = job.returncode and not (f.crash or job.hung or job.stuck_at_exit or job.records("step"))
    if job.ranks and not quit_early:
        return None
    said = script_said(job) or f"exit {job.returncode}"
    return Found(
        f"the script {'did not start' if not job.ranks else 'stopped before training'} under torchrun: {said}"
    )


@summary(8)
def step_8_summary(f):
    if f.job.records("env"):
        return (
            "ok",
            f"torchrun ran it, {len(f.job.ranks)} processes, but the script overrides what it set (step 1)",
        )
    return "ok", f"torchrun ran it as written, {len(f.job.ranks)} processes"
