"""A pitfall of FSDP step 6: rank 0 saves model.state_dict() of the sharded model.

    python pitfalls/fsdp_step6_sharded_state_dict_saved_by_rank_zero.py

After fully_shard, model.state_dict() holds DTensors: each has the parameter's full shape, yet
only this rank's shard of it. Saved by rank 0, the file holds rank 0's rows and nothing of rank
1's: here 29 of the model's 58 numbers. In torch 2.13 the single-GPU script's
torch.load(path, weights_only=True) refuses it ("``torch.distributed.tensor`` must be imported
to load DTensors"); where that is imported, it loads, and load_state_dict into the plain model
fails on every key ("got mixed torch.Tensor and DTensor"); full_tensor() cannot fetch the rest
without the job's process group. The other ranks' shards are not in the file at all.
Two fixes. Gathered: the full state dict, get_model_state_dict(model, options=StateDictOptions(
full_state_dict=True, cpu_offload=True)), gathered by every rank and written by rank 0: plain
tensors, all of them, that load into the plain model; rank 0 must hold the whole model to write it.
Sharded, the way that scales: every rank writes its own shards with torch.distributed.checkpoint
(DCP), dcp.save({"model": model.state_dict()}, checkpoint_id=folder), a file a rank and the folder's
index; dcp.load gives every rank its own shards back, at any world size, and
torch.distributed.checkpoint.format_utils.dcp_to_torch_save makes one file of it, which the plain
model loads (docs/fsdp.md, FSDP step 6).
"""

import gc
import logging
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from _launch import error_line, report, results, run, tell, torchrun
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

# torch.load as the single-GPU script runs it, in a process that has not imported torch.distributed.tensor
PLAIN_LOAD = "import sys, torch; torch.load(sys.argv[1], weights_only=True)"


def build_model():
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def sharded_model(seed):
    torch.manual_seed(seed)  # the same initial weights in every process
    model = build_model()
    for layer in model:  # FSDP step 4: each Linear, then the root
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    return model


def worker(out_dir):  # each process of the job, started by torchrun
    dist.init_process_group("gloo")
    model = sharded_model(seed=0)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), f"{out_dir}/mistake.pt")  # DTensors: rank 0's shards only
        torch.save(full, f"{out_dir}/fix.pt")  # gathered on every rank (a collective), written by rank 0
    # the other fix: every rank writes its own shards (a collective too), and reads them back into a
    # model of other weights, each rank its own shards, in place
    dcp.save({"model": model.state_dict()}, checkpoint_id=f"{out_dir}/sharded")
    other = sharded_model(seed=1)
    state = {"model": other.state_dict()}
    dcp.load(state, checkpoint_id=f"{out_dir}/sharded")
    pairs = zip(model.state_dict().values(), other.state_dict().values(), strict=True)
    tell(rank=dist.get_rank(), restored=all(torch.equal(a.full_tensor(), b.full_tensor()) for a, b in pairs))
    del model, other, state
    gc.collect()  # torch 2.13, gloo: a sharded model alive at exit can abort the process (pytorch#190489)
    dist.destroy_process_group()


def load_into_bare_model(path):
    """Load a checkpoint as the single-GPU script would, here, where torch.distributed.tensor is
    imported; return what it holds and the error, if any."""
    # quiet: unpickling a DTensor's mesh out of its job warns of torch.compile, which this lesson does not use
    logging.getLogger("torch.distributed.device_mesh").setLevel(logging.ERROR)
    state = torch.load(path, weights_only=True)
    try:
        build_model().load_state_dict(state)
    except RuntimeError as error:
        return state, f"RuntimeError: {error}"
    return state, ""


def local(value):
    """What a checkpoint holds of a value: of a DTensor, the shard it was saved with."""
    return value.to_local() if isinstance(value, DTensor) else value


def main():
    with tempfile.TemporaryDirectory() as out_dir:
        told = results(torchrun(__file__, out_dir))
        plain = run([sys.executable, "-c", PLAIN_LOAD, f"{out_dir}/mistake.pt"])
        mistake, mistake_error = load_into_bare_model(f"{out_dir}/mistake.pt")
        fix, fix_error = load_into_bare_model(f"{out_dir}/fix.pt")
        files = sorted(path.name for path in Path(out_dir, "sharded").iterdir())
        dcp_to_torch_save(f"{out_dir}/sharded", f"{out_dir}/converted.pt")  # one process, no job
        converted = torch.load(f"{out_dir}/converted.pt", weights_only=True)["model"]
    refused = error_line(plain.stderr).replace("_pickle.", "")
    mixed = error_line(mistake_error, r"got mixed torch.Tensor and DTensor")
    mixed = mixed[mixed.find("aten.") :].split(", need to")[0]
    weight = mistake["0.weight"]
    gather_error = ""
    if isinstance(weight, DTensor):
        try:
            weight.full_tensor()  # outside the job: no process group to gather with
        except RuntimeError as error:
            gather_error = f"RuntimeError: {error}"
    held = sum(local(v).numel() for v in mistake.values())
    numbers = sum(v.numel() for v in fix.values())
    report(
        mistake="if rank == 0: torch.save(model.state_dict(), path)  # model is sharded by fully_shard",
        symptom=f'the file holds {type(weight).__name__}s: "0.weight" is {tuple(weight.shape)} and holds'
        f" {local(weight).shape[0]} of its rows: {held} of the model's {numbers} numbers in all;\n"
        f"the single-GPU script's torch.load(path, weights_only=True) refuses it:\n{refused}\n"
        f"where DTensor is imported, load_state_dict fails on {mistake_error.count('While copying')}"
        f" of {len(mistake)} keys: {mixed}\n"
        f"and .full_tensor(), out of the job: {gather_error}",
        fix="gathered: on every rank, state = get_model_state_dict(model, options=...full_state_dict=True...)"
        "; rank 0 saves it\n"
        'sharded, at scale: on every rank, dcp.save({"model": model.state_dict()}, checkpoint_id=folder)',
        result=f"{type(fix['0.weight']).__name__}s, all {numbers} numbers; it loads into the plain model"
        + (f", error {fix_error}" if fix_error else "")
        + f"\n{', '.join(files)}: dcp.load gives each rank its shards back; dcp_to_torch_save, one file",
        checks={
            "the mistake's file holds rank 0's shards only": held < numbers
            and torch.equal(local(weight), fix["0.weight"][: local(weight).shape[0]]),
            "the plain load refuses it": "must be imported to load DTensors" in refused,
            "the load into the plain model fails on every key": mixed != ""
            and mistake_error.count("While copying") == len(mistake),
            "out of the job, the rest cannot be gathered": "Could not resolve the process group"
            in gather_error,
            "the fix loads, every number of it": fix_error == ""
            and all(type(v) is torch.Tensor for v in fix.values())
            and numbers == sum(p.numel() for p in build_model().parameters()),
            "every rank wrote its own shards": files == [".metadata", "__0_0.distcp", "__1_0.distcp"],
            "every rank read its own back": sorted(t["rank"] for t in told if t.get("restored")) == [0, 1],
            "the sharded checkpoint converts into the fix's file": converted.keys() == fix.keys()
            and all(torch.equal(converted[k], fix[k]) for k in fix),
        },
        runs=(plain,),
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker(sys.argv[1])
    else:
        main()
