"""The records: the contract between the watcher, which writes them in each rank of the job, and the
judge, which reads them. Each record is a JSON line {"e": kind, field: value, ...} with exactly the
fields SCHEMA declares for its kind; a field added later is in OPTIONAL, with the value an older
record means."""

# The records, the contract between the watcher (which writes them) and the judge (which reads
# them): each is a JSON line {"e": kind, field: value, ...}, with exactly these fields. `at` is
# always the script's own file:line that made the call.
SCHEMA = {
    # a process starts: who torchrun says it is (on the node check_ddp shows it), whether CUDA and
    # NCCL are stood in on the CPU, and the GPUs its node has
    "start": (
        "rank",
        "local_rank",
        "world_size",
        "node",
        "local_world_size",
        "standin",
        "cuda",
        "gpus",
        "torch",
        "env",
    ),
    # twice a second: the watched call the main thread is in (a CALLS key, or None), the script's
    # lines it came from (innermost first), the innermost frame of all
    "now": ("call", "stack", "inner"),
    # step 1: the script writes a launch variable over torchrun's; calls init_process_group (what
    # it passed); the group is made (what it is); destroy_process_group() of the whole group
    "env": ("key", "value", "torchrun", "at"),
    "init": ("at", "backend", "init_method", "rank", "world_size", "store"),
    "met": ("seconds", "rank", "world_size", "backend"),
    "destroy": ("at",),
    # the script (or a library) reads a launch variable, or parses an option named like one
    # (--local_rank, which torchrun never passes): its value, its default, whether it was given
    "read": ("key", "by", "at", "found"),
    "arg": ("option", "value", "default", "given", "at"),
    # step 2, the stand-in's own: a GPU the script asks for (how: set_device, to, cuda, a factory's
    # device=, device_ids, device_id, ...), once per way and line; where the first batch of a model
    # the script put on a GPU is (cuda:N, or cpu), and where the model is (once a model, and once a
    # DDP model); the GPUs of the model a DDP model wraps, or of a model sharded, as the script put it
    # (its "ddp" or "shard" record says where it really is: the CPU)
    "gpu": ("how", "index", "at"),
    "input": ("device", "model", "at"),
    "ddp_gpus": ("at", "devices"),
    # steps 5, 6, 9: a collective the script called itself, after `step` optimizer steps
    "coll": ("name", "at", "step"),
    # step 3: a DataLoader made (its dataset's length and a fingerprint of its data; its
    # DistributedSampler's settings, or false); a pass over it begins (whether gradients are on,
    # whether a DDP model is in eval mode); a batch of it (the dataset indices it holds, or for an
    # iterable dataset a fingerprint of its data)
    "loader": ("id", "at", "dataset", "length", "batches", "data", "sampler", "distributed"),
    "pass": ("loader", "n", "at", "grad", "eval"),
    "end": ("loader", "batches", "backward"),  # a pass over (the loader ran out): batches, backward passes
    "batch": ("loader", "idx", "data"),
    "set_epoch": ("epoch", "at"),
    "join": ("at",),
    # step 4: a DDP model made; one freed (training done); an optimizer step, with what happened
    # since the last (backward passes, those that all-reduced, forwards through DDP, .item()
    # calls by line, the loader of the last batch)
    "ddp": (
        "at",
        "module",
        "compiled",
        "compiled_inside",
        "device_ids",
        "find_unused_parameters",
        "devices",
        "parameters",
    ),
    "ddp_freed": (),
    # a model sharded (FSDP): fully_shard() on a module (FSDP2), or FullyShardedDataParallel(...) (FSDP1):
    # its class, its parameters (the rank's local shards: their count, and their values summed, as
    # sharded, before training), over how many ranks
    "shard": ("at", "how", "module", "parameters", "local", "ranks", "devices"),
    # an optimizer made, where (the script's line that made it), and how many tensors it steps
    "optim": ("at", "tensors"),
    "step": ("n", "backward", "synced", "forward", "items", "loader"),
    # step 10: the first forward without gradients since the last optimizer step (through the DDP
    # model, or the model it wraps), and the loader that gave the last batch
    "eval": ("at", "loader"),
    "compile": ("how", "at", "wraps_ddp", "target"),
    # step 6: torch.save (where, what it holds: describe_checkpoint), torch.load, a state_dict loaded
    # into a model (a DDP model or not; its keys all start with module.), any file written
    "save": ("path", "at", "what"),
    "load_state": ("into", "ddp", "prefixed", "at"),
    "load": ("path", "at", "weights_only", "map_location"),
    "write": ("path", "at", "how", "source"),
    # step 8: the script starts processes of its own, to train in (how: spawn, a Process)
    "spawn": ("how", "at"),
    # the script's own uncaught error: where (and whether the script's own line raised it), in
    # which watched call (CALLS key), in which loader
    "crash": ("type", "message", "at", "by_script", "call", "loader"),
    # this file's own error, in its bookkeeping: caught, and never passed on to the script (once a
    # place); `at` is this file's line
    "fault": ("type", "message", "at"),
    # the process ends: its replicas' weights summed, each training forward's input summed, the
    # graphs torch.compile made, its optimizer steps, its forwards through DDP without gradients
    "exit": ("weights", "inputs", "graphs", "steps", "evaluations"),
}


# Fields added to a kind after jobs were recorded with it: each with the value an older record means.
# A new field goes here, so that jobs recorded before it still load (and judge) as they did.
OPTIONAL = {
    # the crash: who raised it: "raise" (a raise or assert statement of the script's), "call" (a call
    # the script made, inside torch or a library), "checker" (this file's own code); the file its error
    # names (an OSError's filename); the program the script ran that this machine lacks (subprocess's
    # FileNotFoundError); whether the script's own code ran inside the watched call (a model's forward
    # inside DDP's, a dataset's __getitem__ inside the DataLoader's) and raised there, or below it
    "crash": {"raised": "call", "path": None, "program": None, "within": None},
    # a collective on a group of some ranks only (their global ranks), not the whole job's; the folder of a
    # sharded checkpoint (torch.distributed.checkpoint's save, load)
    "coll": {"group": None, "path": None},
    # DDP forwards with gradients that prepared the all-reduce of their backward (DDP decides it at
    # forward time, from require_backward_grad_sync): how many of the step's did, and whether its last
    # did (that one's all-reduce carries every micro-batch's gradients, accumulated)
    "step": {"prepared": None, "last": None},
    # at the end: each forward without gradients' first input, summed (as training's inputs are): what
    # each rank evaluated, to compare between ranks; the files this rank wrote that are empty (nothing in
    # them to tear: a lock, a marker); the script's own Python files it imported (their code is read for
    # what the run did not reach); the local shards of the last model sharded, summed as at its shard
    # record (None: no model was sharded); what the rank wrote into each file it opened to write over ({path:
    # bytes, or None where not known}; None: not looked at); each sharded checkpoint this rank saved, as its
    # metadata says: {folder: [its tensors, those its chunks cover whole]} (what any world size can load)
    "exit": {"eval_inputs": [], "empty": None, "files": None, "sharded": None, "wrote": None, "dcp": None},
    # a file written: "overwrite" (opened to write from its start, or renamed into place), "append";
    # a folder made: "create"; the script's lines that led to it, innermost first (a save's too)
    "write": {"mode": None, "stack": None},
    # a checkpoint saved to a file, read back as torch.load(weights_only=True) reads it: the globals it
    # would refuse (torch.serialization.get_unsafe_globals_in_checkpoint; [] for none, None: not known),
    # and where in the saved object the first such value is, with its type ("['args']: argparse.Namespace")
    "save": {"unsafe": None, "unsafe_at": None, "stack": None},
    # a file loaded: whether its folder is one anyone on the machine may write to (/tmp, say)
    "load": {"shared": None},
    # a DataLoader over a Subset (a split): a fingerprint of the samples of its dataset it holds
    "loader": {"subset": None},
    # an option the script requires, not given, so that its parser refused the command line (and exited)
    "arg": {"refused": None},
    # a GPU the stand-in refused, as CUDA or torch would: "negative" (a negative index), "past_node" (one
    # the node lacks: "invalid device ordinal"), "invalid" (a device torch.device() cannot parse)
    "gpu": {"refused": None},
    # a state dict loaded after training into the replica trained: the replica's weights as training ended
    # (None: before training, or into another model)
    "load_state": {"trained": None},
    # a forward without gradients through a sharded model ("sharded": it all-gathers, a collective), through
    # DDP where DDP syncs the model's buffers first ("ddp": a broadcast from rank 0, a collective), or
    # neither (None: through DDP with no buffers to sync, or the model DDP wraps)
    "eval": {"through": None},
}


def check_record(event):
    """Refuse a record that does not fit SCHEMA (the tests turn this on: CHECK_DDP_STRICT=1)."""
    kind = event.get("e")
    fields = set(event) - {"e"}
    if kind not in SCHEMA or not set(SCHEMA[kind]) <= fields <= set(SCHEMA[kind]) | set(
        OPTIONAL.get(kind, ())
    ):
        raise ValueError(f"check_ddp: a record that does not fit SCHEMA[{kind!r}]: {event}")


# What a job folder is, for the judge that reads it: FORMAT, the layout of job.json and the records
# (raised by hand when it changes), and recorder(), a digest of what is recorded: the record kinds and
# their fields (OPTIONAL's left out: a field added with its default keeps older jobs readable) and the
# calls watched. A folder made by another recorder is not judged (--judge says so): its records may
# lack what today's rules read, or hold what they no longer mean.
FORMAT = 2


def with_defaults(event):
    """A record as today's judge reads it: a field it was recorded without gets its default."""
    missing = OPTIONAL.get(event["e"], {}).keys() - event.keys()
    return {**event, **{name: OPTIONAL[event["e"]][name] for name in missing}} if missing else event
