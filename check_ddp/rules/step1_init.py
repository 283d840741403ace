"""DDP step 1: init the process group.

Its rules, in the order they are tried (ORDER), and its summary. A rule's docstring is its
explanation (python check_ddp.py --explain CODE): its first line the summary; then what happens,
why, and what to do."""

import re

from ..judge.crash import INIT
from ..judge.registry import Found, rule, summary
from ..judge.words import ranks_text


@rule(
    "DDP101",
    "FAIL",
    launch="follows",
    rendezvous=True,
    sets_aside=("launch",),
    see="master_port",
    explains=("crash",),
    help="delete it: torchrun sets MASTER_ADDR and MASTER_PORT (and RANK, LOCAL_RANK, WORLD_SIZE), and "
    "init_process_group() reads them",
)
def master_port_set(f):
    """The script sets MASTER_ADDR or MASTER_PORT itself, over torchrun's.

    torchrun starts a store, where the processes of the job meet, on a port it picks, and gives
    every worker its address in MASTER_ADDR and MASTER_PORT. A script that writes its own (the
    guide's `os.environ['MASTER_PORT'] = '12355'`) sends its ranks to a place where no store
    runs, or where another job's does: they wait in init_process_group() until it times out, or
    meet the wrong job. Delete the lines; init_process_group() reads what torchrun set.
    """
    writes = [(r, e) for r, e in f.job.records("env") if e["key"] in ("MASTER_ADDR", "MASTER_PORT")]
    if not writes:
        return None
    _, e = next(((r, e) for r, e in writes if e["key"] == "MASTER_PORT"), writes[0])
    text = f"{f.code(e['at'])} sets {e['key']}={e['value']}, over torchrun's {e['torchrun']}"
    if f.never_met:
        text += (
            f": the ranks never met ({ranks_text(f.waiting_in(INIT))} waited in init_process_group() "
            f"until stopped after {f.job.silence:g} s without progress)"
        )
    # the ranks that did meet met someone else's job, or no one
    return Found(text, explains=("crash", "hang") if f.never_met else ("crash",))


@rule(
    "DDP102",
    "FAIL",
    launch="follows",
    rendezvous=True,
    help="read RANK, LOCAL_RANK and WORLD_SIZE from the environment torchrun made; never write them",
)
def launch_variable_set(f):
    """The script sets RANK, LOCAL_RANK or WORLD_SIZE itself, over torchrun's.

    torchrun tells each process who it is: RANK (its number in the job), LOCAL_RANK (on its
    node) and WORLD_SIZE. A script that overwrites them makes two processes claim one rank, or a
    world that is not the job's: init_process_group() then waits, or pairs the wrong processes.
    Read them; never write them.
    """
    for _, e in f.job.records("env"):
        return Found(f"{f.code(e['at'])} sets {e['key']}={e['value']}, over torchrun's {e['torchrun']}")
    return None


@rule(
    "DDP108",
    "warn",
    sets_aside=("layout", "always"),  # its course on nodes of one GPU hides the rest, stopped or not
    help="decide from torchrun's WORLD_SIZE (or whether RANK is set), not from torch.cuda.device_count(): a "
    "node of one GPU is still one of a job of many",
)
def distributes_by_the_nodes_gpus(f):
    """The script counts its node's GPUs to decide whether to distribute: on nodes of one GPU, each alone.

    `if torch.cuda.device_count() > 1: init_process_group(...)`, or `mp.spawn(..., nprocs=
    torch.cuda.device_count())`, ties the job to one machine's GPUs: on a node of 8 GPUs it
    distributes, and on several nodes of one GPU each (as the check shows its processes) each process
    trains alone, or starts one process of its own. torchrun says how many processes the job has:
    WORLD_SIZE. A risk of several machines, said as a warning; the rest is checked again as one node
    of all the processes, where the script distributes as on a machine of several GPUs.
    """
    job = f.job
    counted = [e for _, e in job.records("read") if e["key"] == "device_count" and e["by"] == "script"]
    if not counted or job.nnodes < 2 or job.records("init") or any(s["gpus"] != 1 for s in f.starts.values()):
        return None
    spawned_one = all("nprocs=1)" in e["how"] for _, e in job.records("spawn"))
    if not (job.records("step") or job.records("spawn")) or not spawned_one:
        return None
    return Found(
        f"the script counts its node's GPUs ({f.code(counted[0]['at'])}), and on nodes of one GPU each, as "
        "the check shows them, it made no process group: each process trained alone (on a machine of "
        "several GPUs it would distribute)"
    )


@rule(
    "DDP103",
    "FAIL",
    explains=("crash",),
    help="call dist.init_process_group(backend) first, in every process",
)
def group_needed_before_made(f):
    """A collective or DDP was used before any process group was made.

    Every call that exchanges data between processes (DDP's constructor, all_reduce, barrier)
    needs the job's process group, and dist.init_process_group() makes it. Without it, the
    first such call fails with "Default process group has not been initialized". Call
    init_process_group() at the start, in every process.
    """
    if not f.job.records("init") and f.crashed_with("process group has not been initialized"):
        at = f.crash[1]["at"]
        return Found(f"no rank called dist.init_process_group(), and {f.code(at)} needs the group")
    return None


@rule(
    "DDP104", "FAIL", help="call dist.init_process_group(backend) first, in every process", launch="follows"
)
def no_process_group(f):
    """No process called init_process_group(): N processes trained N separate models.

    torchrun started the processes, but without a process group they never exchange anything:
    each trains its own model on its own copy of the data, and the job does the same work N
    times. Call dist.init_process_group() first, then wrap the model in DDP.
    """
    job = f.job
    if job.records("init") or not job.ranks:
        return None
    if (f.crash or job.records("spawn") or job.hung or job.returncode) and not job.records("step"):
        return None  # stopped before it could have made one: not checked
    # the first step of a conversion: what a script that makes no group does apart follows from it
    return Found(
        f"no rank called dist.init_process_group(): each of the {len(job.ranks)} processes trained alone",
        follows={step: "" for step in (3, 4, 5, 6, 8, 10)},
    )


@rule(
    "DDP105",
    "FAIL",
    launch="follows",
    rendezvous=True,
    sets_aside=("launch",),
    see="master_port",
    help="pass no init_method: the default, env://, reads where torchrun's job meets",
)
def init_method_elsewhere(f):
    """init_process_group() is told to meet somewhere else than torchrun's store.

    An init_method such as tcp://localhost:12355 or file:///tmp/x sends the ranks to a place
    torchrun did not set up: they wait there, or meet the processes of another job. Leave
    init_method out; its default, env://, reads MASTER_ADDR and MASTER_PORT from torchrun. (One
    built from those two variables, tcp://MASTER_ADDR:MASTER_PORT, is torchrun's store too: fine.)
    """
    inits = f.job.records("init")
    if inits and inits[0][1]["init_method"] not in (None, "env://") and not torchruns_store(f, *inits[0]):
        e = inits[0][1]
        return Found(
            f"{f.code(e['at'])} passes init_method={e['init_method']!r}: not where torchrun's job meets",
            explains=f.init_failed,
        )
    return None


def torchruns_store(f, rank, init):
    """Whether init_process_group()'s init_method names the address and port torchrun gave the rank
    (tcp://MASTER_ADDR:MASTER_PORT, built from its variables): torchrun's store, as env:// reads it."""
    env = next((s["env"] for r, s in f.job.records("start") if r == rank), {})
    url = re.fullmatch(r"tcp://\[?([^\]/?]+?)\]?:(\d+)/?(\?.*)?", str(init["init_method"]))
    return bool(url) and (url[1], url[2]) == (env.get("MASTER_ADDR"), env.get("MASTER_PORT"))


@rule(
    "DDP106",
    "FAIL",
    launch="follows",
    rendezvous=True,
    sets_aside=("launch",),
    help="leave rank= and world_size= out: init_process_group() reads them from torchrun",
)
def rank_passed_wrong(f):
    """init_process_group() is passed a rank or world size that is not torchrun's.

    torchrun numbers the processes; a rank or world_size the script works out for itself (from
    its own arguments, or from a device count) can give two processes the same rank, or a world
    that waits for processes that never come. Leave rank= and world_size= out.
    """
    for r, e in f.job.records("init"):
        env = next((s["env"] for rr, s in f.job.records("start") if rr == r), {})
        for key in ("rank", "world_size"):
            value = e[key]
            if value not in (None, -1) and str(value) != env.get(key.upper()):
                return Found(
                    f"{f.code(e['at'])} passes {key}={value} on rank {r}, but torchrun made it "
                    f"{key.upper()}={env.get(key.upper())}",
                    help=f"leave {key}= out: init_process_group() reads {key.upper()} from torchrun",
                    explains=f.init_failed,
                )
    return None


@rule(
    "DDP107",
    "FAIL",
    hang=True,
    launch="follows",
    explains=("hang",),
    help="every process of the job must call init_process_group() with what torchrun set",
)
def never_met(f):
    """The ranks never met: some waited in init_process_group() until the job was stopped.

    init_process_group() returns only once every rank of the world has arrived. Here some ranks
    were still waiting when the job stopped making progress: a rank that never called it (it
    crashed first, or took another branch), or ranks told different places or sizes.
    """
    inits = f.job.records("init")
    if inits and f.never_met:
        e = inits[0][1]
        return Found(
            f"the ranks never met: {ranks_text(f.waiting_in(INIT))} waited in init_process_group() at "
            f"{f.code(e['at'])} until stopped after {f.job.silence:g} s without progress"
        )
    return None


@summary(1)
def step_1_summary(f):
    job = f.job
    inits, met = job.records("init"), job.records("met")
    if not job.ranks:
        return "--", "not checked: the script never started (step 8)"
    if not inits:
        return "--", "not checked: the job stopped before any rank made its process group"
    if len(met) < len(job.ranks) or not met:
        return "--", "not checked: the job stopped before every rank had joined the group"
    seconds = max(m["seconds"] for _, m in met)
    backend = met[0][1]["backend"]
    if backend == "undefined":  # no backend given: torch's default, one per device type
        backend = "the default backend: gloo on CPUs, nccl on GPUs"
    if f.asked_nccl and f.standin:
        backend = f"{inits[0][1]['backend']}, stood in by {backend}"
    return "ok", f"{len(met)} ranks met ({backend}) at {inits[0][1]['at']}, in {seconds:.1f} s"
