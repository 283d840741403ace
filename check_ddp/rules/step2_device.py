"""DDP step 2: place each process on its device.

Its rules, in the order they are tried (ORDER), and its summary. A rule's docstring is its
explanation (python check_ddp.py --explain CODE): its first line the summary; then what happens,
why, and what to do."""

from ..judge.registry import Found, rule, summary
from ..judge.words import ranks_text
from ..standin.devices import FACTORIES
from ..watch.launch import LOCAL_RANK_KEYS


@rule(
    "DDP201",
    "FAIL",
    see="global_rank_device",
    explains=("crash",),
    sets_aside=("layout",),
    help="use LOCAL_RANK, the process's number on its node, as the GPU index, not RANK",
)
def device_past_the_node(f):
    """A rank asked for a GPU its node does not have ("invalid device ordinal").

    GPUs are numbered per node, 0 to the node's count - 1. The global rank runs over every node:
    on the second node of 2 x 4 GPUs, rank 4 asks for cuda:4, which is not there. LOCAL_RANK is
    the process's number on its node: use it as the GPU index.
    """
    past = [(r, e) for r, e in f.refused.items() if e["refused"] == "past_node"]
    if past and f.crash:  # the stand-in refused it, as CUDA does
        rank, e = past[0]
        return Found(f"rank {rank} asked for cuda:{e['index']}, a GPU its node lacks, at {f.code(e['at'])}")
    if not f.standin and f.crashed_with("invalid device ordinal"):  # CUDA's own refusal, on GPUs
        rank, e = f.crash
        return Found(f"rank {rank} asked for a GPU its node lacks at {f.code(e['at'])}")
    return None


@rule(
    "DDP202",
    "FAIL",
    see="global_rank_device",
    help="torch.cuda.set_device(local_rank) and model.to(f'cuda:{local_rank}'), from LOCAL_RANK",
)
def model_on_another_gpu(f):
    """A rank's model is not on the GPU of its LOCAL_RANK.

    Each process must use its own GPU, the one numbered by its LOCAL_RANK: two processes on one
    GPU share its memory and its time, and nccl refuses them. Set the device from LOCAL_RANK,
    move the model there, and give DDP device_ids=[local_rank].
    """
    wrong = {
        r: d
        for r, d in f.model_devices.items()
        if d[0].startswith("cuda") and d != [f"cuda:{f.local_rank(r)}"]
    }
    if wrong and f.on_gpus:
        r, d = sorted(wrong.items())[0]
        return Found(f"rank {r} (LOCAL_RANK {f.local_rank(r)}) has its model on {', '.join(d)}")
    return None


@rule(
    "DDP203",
    "FAIL",
    launch="follows",
    help="take the GPU from LOCAL_RANK: local_rank = int(os.environ['LOCAL_RANK']); "
    "torch.cuda.set_device(local_rank); model.to(local_rank)",
)
def one_gpu_for_a_node(f):
    """The processes of a node would all use one GPU: the GPU index does not come from LOCAL_RANK.

    torchrun starts a process per GPU of a node, and tells each its number on the node in
    LOCAL_RANK. A script that uses cuda:0, .cuda() with no device set, or a local rank it never
    gets from torchrun (--local_rank, which torchrun does not pass), puts every process of a
    node on GPU 0: they share its memory, and nccl refuses two ranks on one GPU. Here either two
    ranks of one node had their models on one GPU, or every rank used GPU 0 and none read
    LOCAL_RANK.
    """
    if not f.on_gpus:
        return None
    by_gpu = {}
    for r, d in f.model_devices.items():
        by_gpu.setdefault((f.starts[r]["node"], d[0]), []).append(r)
    shared = sorted(
        (ranks, key) for key, ranks in by_gpu.items() if len(ranks) > 1 and key[1].startswith("cuda")
    )
    if shared:
        ranks, (node, gpu) = shared[0]
        return Found(f"{ranks_text(ranks)}, on node {node}, have their models on one GPU, {gpu}")
    devices = {d[0] for d in f.model_devices.values()}
    # the local rank, as any launcher says it, or rank % torch.cuda.device_count(): the node's GPU
    from_node = any(f.read(key) for key in (*LOCAL_RANK_KEYS, "device_count"))
    if len(f.model_devices) == f.world > 1 and devices == {"cuda:0"} and not from_node:
        where_asked = next((e["at"] for _, e in f.job.records("gpu") if e["at"]), None)
        return Found(
            f"every rank has its model on cuda:0 ({f.code(where_asked) if where_asked else 'no GPU named'}), "
            "and no rank read LOCAL_RANK: on a node of several GPUs, its processes would all use GPU 0"
        )
    return None


@rule(
    "DDP204",
    "FAIL",
    help="move the model to its GPU before wrapping it: model.to(torch.device('cuda', local_rank))",
)
def model_left_on_cpu(f):
    """The model is on the CPU while the backend is nccl: on GPUs, DDP(...) fails.

    nccl exchanges tensors between GPUs only. A model never moved to its GPU keeps its
    parameters on the CPU, and DDP's first broadcast of them fails (or, moved later by hand,
    trains at CPU speed). Move the model to the process's GPU, then wrap it.
    """
    if f.standin and f.asked_nccl:
        on_cpu = sorted(r for r, d in f.model_devices.items() if d == ["cpu"])
        if on_cpu:
            wrapped = f.job.records("ddp", rank=on_cpu[0]) or f.job.records("shard", rank=on_cpu[0])
            e = wrapped[0][1]
            return Found(
                f"{ranks_text(on_cpu)} wrapped a model whose parameters are on the CPU "
                f"({e.get('how', 'DDP')} at {f.code(e['at'])}), and the backend is nccl"
            )
    return None


@rule(
    "DDP205",
    "FAIL",
    help="move each batch to the model's GPU (x = x.to(device)), or give DDP device_ids=[local_rank], "
    "which moves its inputs",
)
def batches_left_on_cpu(f):
    """The batches reach the model on the CPU while the model is on a GPU: on GPUs, forward() fails.

    A layer's weights and its input must be on one device. With device_ids, DDP moves its inputs
    to the model's GPU itself; without DDP, or without device_ids, they reach the model where
    they are, and on a GPU the first layer fails. Move each batch to the model's GPU.
    """
    if not f.standin:
        return None
    # tensors made from one on a GPU (sliced, cast, stacked) are on it too, and the stand-in cannot follow
    # them: a batch that looks as if on the CPU proves nothing where the script moves data to a GPU at all
    moved = {"to", "cuda", *FACTORIES, "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor"}
    if any(g["how"] in moved for _, g in f.job.records("gpu")):
        return None
    for r, e in f.job.records("input"):
        ddp = f.job.records("ddp", rank=r)
        if e["device"] == "cpu" and e["model"].startswith("cuda") and not (ddp and ddp[0][1]["device_ids"]):
            wrapped = f", and DDP(...) at {f.code(ddp[0][1]['at'])} has no device_ids" if ddp else ""
            return Found(
                f"rank {r}'s batches reach the model on the CPU ({f.code(e['at'])}) while the model is on "
                f"{e['model']}{wrapped}"
            )
    return None


@rule(
    "DDP206",
    "warn",
    help="set the GPU first: torch.cuda.set_device(local_rank) before dist.init_process_group(), or pass "
    "device_id=torch.device('cuda', local_rank) to it",
)
def collective_before_the_gpu(f):
    """A collective ran before the rank's GPU was set: nccl runs it on GPU 0 of the node.

    nccl runs a collective on the process's current GPU. Until torch.cuda.set_device(local_rank) (or
    init_process_group(..., device_id=...)), that is GPU 0: a barrier (or a broadcast) made before it
    puts every rank of the node on GPU 0, to allocate its communicator there, and may hang when the
    ranks later meet on their own GPUs. DDP step 2 comes first in the code: set the GPU, then make the
    group, and nccl's work lands on each rank's own GPU.
    """
    if not f.asked_nccl or not f.on_gpus:
        return None
    for r, events in sorted(f.job.ranks.items()):
        kinds = [e for e in events if e["e"] in ("coll", "gpu")]
        first_coll = next((i for i, e in enumerate(kinds) if e["e"] == "coll"), None)
        first_set = next(
            (i for i, e in enumerate(kinds) if e["e"] == "gpu" and e["how"] in ("set_device", "device_id")),
            None,
        )
        if first_coll is not None and (first_set is None or first_set > first_coll):
            e = kinds[first_coll]
            return Found(
                f"rank {r} called dist.{e['name']}() at {f.code(e['at'])} before its GPU was set: on a node "
                "of several GPUs, nccl runs it on GPU 0 for every rank of the node"
            )
    return None


@summary(2)
def step_2_summary(f):
    if not f.on_gpus:
        if f.job.device == "cuda" or f.standin:
            return "--", "not checked: the script runs on the CPU (no GPU asked for)"
        return "--", "not checked: no GPU here"
    if not f.model_devices:
        return "--", "not checked: no model was wrapped in DDP"
    stood_in = " (stood in)" if f.standin else ""
    return "ok", f"each rank's model is on the GPU of its LOCAL_RANK{stood_in}: " + ", ".join(
        f"rank {r} on {d[0]}" + (f" of node {f.starts[r]['node']}" if f.job.nnodes > 1 else "")
        for r, d in sorted(f.model_devices.items())
    )
