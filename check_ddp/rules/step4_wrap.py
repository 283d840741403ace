"""DDP step 4: wrap the model.

Its rules, in the order they are tried (ORDER), and its summary. A rule's docstring is its
explanation (python check_ddp.py --explain CODE): its first line the summary; then what happens,
why, and what to do."""

from ..judge.evidence import sharded_unchanged
from ..judge.registry import Found, rule, summary
from ..judge.words import plural


@rule(
    "DDP401",
    "FAIL",
    see="unused_parameter",
    explains=("crash",),
    help="remove the parameter, or pass find_unused_parameters=True to DDP (slower)",
)
def unused_parameter(f):
    """A parameter got no gradient, so DDP's all-reduce never finished ("Expected to have finished ...").

    DDP all-reduces gradients in buckets, and a bucket goes once every parameter in it has its
    gradient. A parameter that forward() does not use never gets one: the bucket never goes, and
    the next iteration fails. Remove the parameter, use it, or pass find_unused_parameters=True
    (which walks the autograd graph after every forward: slower).
    """
    if f.crashed_with("Expected to have finished reduction"):
        rank, e = f.crash
        return Found(
            f"rank {rank}: a parameter got no gradient in the last step, so DDP's all-reduce never "
            f"finished ({f.code(e['at'])}): a parameter forward() does not use"
        )
    return None


@rule(
    "DDP403",
    "FAIL",
    launch="follows",
    help="model = DDP(model, device_ids=[local_rank]) (no device_ids on a CPU), after moving it to its "
    "device",
)
def not_wrapped(f):
    """No rank wrapped its model in DDP: the ranks train apart, each its own replica.

    Without DDP nothing averages the gradients: each rank takes its own steps on its own shard,
    and the replicas drift apart. The job trains N different models, each on 1/N of the data.
    Wrap the model in DDP once it is on its device. (A script that averages the gradients itself,
    all-reducing them before each step, keeps the replicas equal: that is no mistake.)
    """
    wrapped = f.job.records("ddp") or f.job.records("shard")
    if f.job.records("step") and not wrapped and not f.synced_by_hand:
        differ = f.weights_differ
        return Found(
            "no rank wrapped its model in DDP: the ranks train apart, each its own replica"
            + (f", and end apart: {differ}" if differ else "")
        )
    return None


@rule("DDP404", "FAIL", help="call the DDP model (ddp_model(x)) in training, not the model it wraps")
def wrapper_never_called(f):
    """The model is wrapped, but training calls the model it wraps: no gradient is all-reduced.

    DDP sets up the all-reduce of the gradients in its own forward(). Calling the inner model
    (model.module(x), or a reference kept from before the wrap) skips it: the gradients stay
    local, and the replicas drift apart. Train through the DDP model.
    """
    steps, ddp = f.job.records("step"), f.job.records("ddp")
    if steps and ddp and sum(e["forward"] for _, e in steps) == 0:
        differ = f.weights_differ
        return Found(
            f"the model is wrapped at {f.code(ddp[0][1]['at'])}, but training never calls the wrapper: no "
            "forward went through DDP, so no gradient was all-reduced" + (f" ({differ})" if differ else "")
        )
    return None


@rule(
    "DDP409",
    "FAIL",
    help="device_ids=[local_rank], the GPU the model is on: DDP(model, device_ids=[device.index])",
)
def device_ids_elsewhere(f):
    """DDP's device_ids name another GPU than the one the model is on: on GPUs, the first forward fails.

    With device_ids, DDP moves each batch to device_ids[0] before the model's forward. A model on
    cuda:1 wrapped with device_ids=[0] (a --local_rank that stayed 0, the global rank where the local
    one was meant) gets its batches on cuda:0, and its first layer fails ("Expected all tensors to be
    on the same device"). Give DDP the GPU the model is on.
    """
    if not f.on_gpus:
        return None
    for r, e in f.job.records("ddp"):
        asked = [d.rpartition(":")[2] for d in e["device_ids"]]
        # the node's GPU it names, where the stand-in says (a process that narrowed CUDA_VISIBLE_DEVICES
        # to its own GPU names it cuda:0): the model's devices are told the same way
        named = [
            g["index"]
            for rr, g in f.job.records("gpu")
            if rr == r and g["how"] == "device_ids" and g["at"] == e["at"]
        ]
        model = f.model_devices.get(r, [])
        if asked and asked[0].isdigit() and len(model) == 1 and model[0].startswith("cuda:"):
            if model[0] != f"cuda:{named[0] if named else asked[0]}":
                return Found(
                    f"rank {r}'s model is on {model[0]}, and DDP(...) at {f.code(e['at'])} is given "
                    f"device_ids=[{asked[0]}]: DDP moves its batches to cuda:{asked[0]}"
                )
    return None


@rule(
    "DDP405",
    "FAIL",
    across=True,
    help="every rank must take the same optimizer steps on the DDP model's all-reduced gradients",
)
def replicas_differ(f):
    """The replicas' weights differ at the end of training.

    DDP keeps the replicas equal only if every rank applies the same update: the same optimizer
    steps, on the all-reduced gradients, with nothing changed on one rank alone (a learning rate
    set from a local metric, weights loaded on rank 0 after the wrap).
    """
    ddp = f.job.records("ddp")
    if f.job.records("step") and ddp and f.weights_differ:
        return Found(f"the replicas differ at the end: {f.weights_differ} (DDP at {f.code(ddp[0][1]['at'])})")
    return None


# torch.distributed.checkpoint.state_dict's functions that read an optimizer beside its model
OPTIMIZER_READERS = (
    "get_optimizer_state_dict",
    "set_optimizer_state_dict",
    "get_state_dict",
    "set_state_dict",
)


@rule(
    "DDP408",
    "FAIL",
    see="optimizer_before_shard",
    help="build the optimizer after fully_shard(model), from model.parameters(): the sharded parameters",
)
def sharded_model_never_changed(f):
    """The optimizer steps changed no parameter of the sharded model: it holds the ones sharding replaced.

    fully_shard() (FSDP2) puts new parameters in the model's place, each this rank's shard (a
    DTensor). An optimizer built before it holds the old ones, which no forward uses any more: its
    steps move nothing the model computes with, without a word, and the loss stays where it was.
    Build the optimizer after sharding, from model.parameters(). (Seen by its effect: every rank's
    shards, summed as they are held, are what they were when sharded, after the optimizer steps.)
    """
    if sharded_unchanged(f):
        e = f.job.records("shard")[-1][1]
        steps = max((x["steps"] for _, x in f.job.records("exit")), default=0)
        events = f.job.ranks[min(f.job.ranks)]
        sharded_at = max(i for i, x in enumerate(events) if x["e"] == "shard")
        before = [x for x in events[:sharded_at] if x["e"] == "optim"]
        made = f" the optimizer made at {f.code(before[0]['at'])}, before sharding," if before else ""
        # the state-dict API reads the optimizer beside the model: its parameters are not the model's
        crash = f.crash and f.crash[1]["call"] or ""
        pairs = crash.rpartition(".")[2] in OPTIMIZER_READERS and "distributed.checkpoint" in crash
        failed = f"; so {crash.rpartition('.')[2]}() fails at {f.code(f.crash[1]['at'])}" if pairs else ""
        return Found(
            f"after {plural(steps, 'optimizer step')}, no rank's shards of the model sharded at "
            f"{f.code(e['at'])} changed:{made} steps parameters the model no longer uses{failed}",
            explains=("crash",) if pairs else None,
        )
    return None


@rule(
    "DDP406",
    "warn",
    see="unused_parameter",
    help="leave find_unused_parameters out (it is False by default)",
)
def find_unused_for_nothing(f):
    """DDP(..., find_unused_parameters=True), and every parameter is used.

    With find_unused_parameters=True DDP walks the autograd graph after every forward to find
    parameters that will get no gradient. When there are none, that is work for nothing, every
    step; DDP says so in the job's output.
    """
    ddp = f.job.records("ddp")
    if f.job.records("step") and ddp and "did not find any unused parameters" in f.job.output:
        return Found(
            f"DDP(..., find_unused_parameters=True) at {f.code(ddp[0][1]['at'])}, and every parameter is "
            "used: DDP walks the autograd graph after every forward for nothing"
        )
    return None


@rule(
    "DDP407",
    "warn",
    see="compile_order",
    help="compile the bare model, then wrap it: model = DDP(torch.compile(model))",
)
def compiled_nothing(f):
    """torch.compile was applied in an order that compiles nothing.

    torch.compile(DDP(model)), or model.compile() before the wrap, can leave the compiler with
    nothing it captures (torch's counters show 0 graphs): the job runs uncompiled. Compile the
    bare model and wrap the compiled one: DDP(torch.compile(model)).
    """
    job = f.job
    if not job.records("step") or not job.records("ddp"):
        return None
    compiles = [e for _, e in job.records("compile") if e["wraps_ddp"]]
    compiled_before = [e for _, e in job.records("ddp") if e["compiled"]]
    graphs = max((e["graphs"] or 0 for _, e in job.records("exit")), default=0)
    if (compiles or compiled_before) and not graphs:
        e = compiles[0] if compiles else compiled_before[0]
        how = "torch.compile(DDP(model))" if compiles else "model.compile() before DDP(model)"
        return Found(f"{how} at {f.code(e['at'])} compiled nothing (torch's compiler captured 0 graphs)")
    return None


@summary(4)
def step_4_summary(f):
    job = f.job
    if not job.records("step"):
        return "--", "not checked: no optimizer step ran"
    total = max(e["steps"] for _, e in job.records("exit")) if job.records("exit") else None
    shards = job.records("shard")
    if shards and not job.records("ddp"):  # one copy, sharded: its effect is that training changed it
        e = shards[-1][1]
        changed = (
            "changed by training"
            if sharded_unchanged(f) is False
            else "not checked whether training changed it"
        )
        return "ok", (
            f"{e['how']}() of {e['module']} at {e['at']}, one copy of the weights sharded over "
            f"{plural(e['ranks'] or len(job.ranks), 'rank')}, {changed}"
            + (f" ({plural(total, 'optimizer step')})" if total else "")
        )
    if not job.records("ddp"):  # the gradients all-reduced by hand (else DDP403): the replicas equal
        return "ok", "no DDP, and the replicas are equal at the end: the script averages the gradients itself"
    equal = "the replicas are equal at the end" if f.weights_differ == "" else "every forward went through it"
    return "ok", f"DDP at {job.records('ddp')[0][1]['at']}; {equal}" + (
        f" ({plural(total, 'optimizer step')})" if total else ""
    )
