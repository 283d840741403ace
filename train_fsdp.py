"""Train a small regression model with FSDP2 (fully_shard): the DDP steps, four of them changed.

DDP step 8: launch with torchrun. It starts one copy of this script per process
(one per GPU, or several on a CPU) and tells each copy who it is.

    torchrun --standalone --nproc_per_node=2 train_fsdp.py --batch_size 32   # the baseline's twin
    torchrun --standalone --nproc_per_node=4 train_fsdp.py --batch_size 16
    python train_fsdp.py        # without torchrun: a one-process job

Several nodes: see docs/multi-node.md. The same command runs on CPUs (gloo), and is
written for GPUs (nccl): one GPU has run it, several not yet. Read it next to its DDP twin,
train_ddp.py: `diff -u train_ddp.py train_fsdp.py` shows what FSDP2 changes, each hunk
naming its FSDP step, numbered as the DDP step it replaces (docs/fsdp.md): FSDP step 4:
shard the model; FSDP step 6: checkpoint: gather on every rank, write on rank 0; FSDP
step 9: accumulate with set_requires_gradient_sync(False); FSDP step 10: evaluate on
every rank. Each process holds 1/N of the weights, their gradients and the optimizer's
state, where DDP holds them whole on each. The plumbing the twins share comes after the
lesson, byte for byte as theirs but where an FSDP step says otherwise.
"""

import argparse
import gc
import json
import math
import os
import sys
import tempfile  # DDP step 1, optional: plain python's group of one meets at a file
import time
from pathlib import Path

import filelock
import torch
import torch.distributed as dist  # DDP step 1: the process group and its collectives
import torch.distributed.checkpoint as dcp  # FSDP step 6: sharded checkpoints, every rank its shards
import torch.distributed.checkpoint.state_dict as dsd  # FSDP step 6: state dicts keyed by name
from torch.distributed.fsdp import fully_shard  # FSDP step 4
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler, TensorDataset  # DDP step 3

# -----------------------------------------------------------------------------
# the lesson: the guide's setup(), cleanup() and train(), its steps in its order


def setup(args):
    """DDP steps 1 and 2: join the job's process group, on this process's own device."""
    # DDP step 2: place each process on its device. It comes first in the code: the process
    # group binds nccl to the GPU it is given. LOCAL_RANK numbers the processes, and so the
    # GPUs, of this node; the guide uses the global rank, which asks for cuda:4 on the second
    # node of 2 x 4 GPUs.
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)  # so kernels, pinned memory and caches use this GPU
    # DDP step 1: init the process group: nccl between GPUs, gloo between CPUs.
    backend = "nccl" if device.type == "cuda" else "gloo"
    if "RANK" in os.environ:
        # torchrun told each process who it is, in its environment: RANK (0 .. WORLD_SIZE-1 over
        # all nodes), LOCAL_RANK, WORLD_SIZE, and MASTER_ADDR/MASTER_PORT, where to meet; this reads
        # them. Never set them yourself: the guide's MASTER_PORT=12355 overrides torchrun's, and
        # the workers hang.
        dist.init_process_group(backend, device_id=device.index)
    else:  # optional: plain `python script.py`, without torchrun (one_process_group, below)
        one_process_group(backend)
    return device


def cleanup():
    """DDP step 7: clean up: leave the process group, once every rank is done with it."""
    dist.destroy_process_group()


def train(args):
    """Train and evaluate, one epoch at a time, checkpointing as we go."""
    device = setup(args)  # DDP steps 1 and 2

    # the data: every process draws the very same seeded data (the guide's unseeded
    # torch.randn gives each rank different data, and random labels nothing can learn)
    dataset, val_set = make_data(args)
    # DDP step 3: shard the data. Each epoch, every rank draws the same seeded shuffle
    # and keeps every world_size-th index from its rank on: disjoint shards that cover
    # the data (padded with repeats when world_size does not divide it). So N processes
    # at batch B visit the same global batches as the baseline at batch N x B.
    sampler = DistributedSampler(dataset, seed=args.seed)
    # batches come whole, as dataset[list of indices]: one indexing op each, instead of
    # batch_size __getitem__ calls and a collate (how much faster: benchmarks/batch_fetch.py)
    batches = BatchSampler(sampler, args.batch_size, drop_last=False)
    loader = DataLoader(
        dataset,
        sampler=batches,
        batch_size=None,
        num_workers=args.num_workers,
        pin_memory=device.type == "cuda",  # page-locked host memory: copies to the GPU overlap compute
    )
    check_epoch(args, len(loader))

    torch.manual_seed(args.seed)  # every run starts from the same weights
    # FSDP step 4: shard the model. It is built on the meta device: its shapes, and no memory, no
    # values. Then block by block (here each Linear; a ReLU holds no weights): its weights are made on
    # the CPU and drawn as the baseline draws them (the same seeded numbers, in the same order, on
    # every rank), moved to this rank's device, and fully_shard keeps 1/N of every weight, its rows
    # (a DTensor), and frees the rest. So no rank ever holds the whole model: one block whole
    # at a time, and its shards of the blocks before. Why these draws, not DTensor's own seeded
    # initialisation of the shards alone: they are the baseline's numbers, so that N processes end
    # with its weights (the proofs); a model whose weights must never be drawn whole, even one block
    # at a time, starts from a seed checkpoint instead, made once and read as a sharded checkpoint
    # (docs/fsdp.md). Then fully_shard on the root: what the blocks left (nothing here). In training,
    # a block all-gathers its whole weights just before it runs, forward and backward, and frees them
    # after; backward reduce-scatters its gradients, each rank getting the mean of its own rows.
    with torch.device("meta"):
        model = make_model(args)
    # the mesh: the job's processes, on this process's device type (fully_shard's own default takes
    # the GPU wherever there is one, even under --device cpu)
    mesh = dist.init_device_mesh(device.type, (dist.get_world_size(),))
    for block in model:
        if isinstance(block, torch.nn.Linear):
            block.to_empty(device="cpu").reset_parameters()
            fully_shard(block.to(device), mesh=mesh)
    fully_shard(model, mesh=mesh)
    # FSDP step 4: the optimizer comes after sharding: fully_shard put sharded parameters (DTensors)
    # in place of the model's own, and the optimizer must hold those, to update each rank's shard
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = torch.nn.MSELoss()
    # FSDP step 6, the load: it comes after sharding, into the sharded model and its optimizer, each
    # rank its own shards (load_checkpoint): of a sharded checkpoint, every rank reads its own; of a
    # whole file, rank 0 alone reads it and sends each tensor to the others. Rank 0 chooses the
    # checkpoint (ranks of several nodes may see a shared --out_dir differently).
    choice = [args.resume]
    dist.broadcast_object_list(choice)  # rank 0's list is sent to every rank, in place of its own
    start_epoch = load_checkpoint(choice[0], args, model, optimizer, device)

    metrics = open_metrics(args, start_epoch) if dist.get_rank() == 0 else None  # DDP step 6: rank 0 writes
    start = time.perf_counter()
    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # DDP step 3: a new shuffle each epoch, the same one on every rank
        model.train()
        epoch_start = time.perf_counter()
        # the loss is summed on the device as (loss x samples): no .item() per batch,
        # which would stall a GPU at each, and the mean stays exact for a short last batch
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        samples = 0
        # --profile: a few batches of the run's second epoch are recorded (profiled(), below)
        for step, (xb, yb) in enumerate(profiled(loader, args, record=epoch == start_epoch + 1)):
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            # --grad_accum_steps K: K micro-batches make one optimizer step, each loss
            # divided by K so that the step is that of one batch K times as large
            last = (step + 1) % args.grad_accum_steps == 0 or step + 1 == len(loader)
            # FSDP step 9: accumulate with set_requires_gradient_sync(False), where DDP used
            # no_sync(). Until the last micro-batch of the step, backward() keeps each rank's
            # gradients local and whole: they are reduce-scattered once, on the last, not K times
            model.set_requires_gradient_sync(last)
            loss = loss_fn(model(xb), yb)
            (loss / args.grad_accum_steps).backward()
            if last:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
            loss_sum += loss.detach() * len(xb)
            samples += len(xb)
        totals = torch.stack([loss_sum, loss_sum.new_tensor(samples)])
        # DDP step 5: all-reduce the metrics. Sum (loss x samples, samples) over all ranks,
        # once per epoch: the exact mean over every sample seen. The guide averages per-batch
        # means over num_batches * world_size, which is wrong when the last batch is short.
        # Every rank gets the same totals, so every rank decides alike what comes next.
        dist.all_reduce(totals)
        loss_total, samples_total = totals.tolist()  # waits for the device, so the clock is honest
        seconds = time.perf_counter() - epoch_start

        # DDP step 10: evaluate exactly. Each rank evaluates every world_size-th held-out
        # sample from its rank on: shards that cover the set once. (DistributedSampler would
        # pad them to equal sizes with repeats, and the repeats would count twice.)
        model.eval()
        val_sum = torch.zeros((), dtype=torch.float64, device=device)
        val_samples = 0
        val_indices = range(dist.get_rank(), len(val_set), dist.get_world_size())
        with torch.no_grad():
            # FSDP step 10: evaluate on every rank. The sharded model's forward all-gathers each
            # block's weights, a collective: every rank runs it, as many times (there is no bare
            # model.module to run alone). The shards differ in size by one sample at most: every
            # rank runs the batches of the longest, rank 0's, and a shorter shard's last may be
            # empty: it adds nothing, and takes part in the all-gathers.
            for first in range(0, math.ceil(len(val_set) / dist.get_world_size()), args.batch_size):
                indices = val_indices[first : first + args.batch_size]
                xb, yb = (tensor.to(device) for tensor in val_set[indices])
                val_sum += torch.nn.functional.mse_loss(model(xb), yb, reduction="sum")
                val_samples += len(xb)
        val_totals = torch.stack([val_sum, val_sum.new_tensor(val_samples)])
        dist.all_reduce(val_totals)  # DDP step 10: sums and counts, once per epoch
        val_total, val_samples_total = val_totals.tolist()
        record = {
            "epoch": epoch + 1,
            "loss": loss_total / samples_total,
            "val_loss": val_total / val_samples_total,
            "samples": int(samples_total),
            "seconds": seconds,
            "samples_per_sec": samples_total / seconds,
            "world_size": dist.get_world_size(),  # DDP step 5
            "backend": dist.get_backend(),  # DDP step 5
            "device": str(device),
        }
        check_finite(record)  # a diverged run stops here, before it logs or saves a NaN
        # FSDP step 6: checkpoint: every rank writes its own shards. Rank 0 prints the report for
        # all; every rank calls save_checkpoint, outside `if rank == 0`: each writes its own shards,
        # together, a collective (inside that block rank 0 would wait in it for ranks that never
        # come). After the last epoch, the whole model too, gathered on every rank and written by
        # rank 0 alone, as one file in the other twins' format.
        if dist.get_rank() == 0:
            report(record, metrics, args.epochs, time.perf_counter() - start)
        save_checkpoint(args, model, optimizer, epoch + 1)  # every --save_interval epochs
    cleanup()  # DDP step 7


# -----------------------------------------------------------------------------
# the task: data a small model can learn, and the model


def make_data(args):
    """Training and held-out samples of y = sin(x . w) + noise, from one seeded generator."""
    generator = torch.Generator().manual_seed(args.seed)
    w = torch.randn(IN_FEATURES, 1, generator=generator) / math.sqrt(IN_FEATURES)  # the hidden function

    def draw(n):  # the noise makes 0.01 the lowest loss reachable
        x = torch.randn(n, IN_FEATURES, generator=generator)
        return TensorDataset(x, torch.sin(x @ w) + 0.1 * torch.randn(n, 1, generator=generator))

    return draw(args.dataset_size), draw(args.val_size)  # held out: drawn after, so disjoint


def make_model(args):
    return torch.nn.Sequential(
        torch.nn.Linear(IN_FEATURES, args.hidden_size),
        torch.nn.ReLU(),
        torch.nn.Linear(args.hidden_size, args.hidden_size),
        torch.nn.ReLU(),
        torch.nn.Linear(args.hidden_size, 1),
    )


IN_FEATURES = 10


# -----------------------------------------------------------------------------
# plumbing, byte for byte the same in both scripts: the command line and its checks,
# the --out_dir rule, checkpoints written whole and read safely, the metrics file


class Refused(Exception):
    """A stop the user can act on (a bad flag, a folder in use, a diverged run): one line, no traceback."""


class Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse's own refusals (a bad value, an unknown flag) too
        raise Refused(f"{message} (see --help)")


def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text}")
    return value


def positive_float(text):
    value = float(text)
    if not 0 < value < math.inf:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, not {text}")
    return value


def writable_dir(text):
    path = Path(text).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise argparse.ArgumentTypeError(
            f"cannot create or write {text}: {existing} is not a writable folder"
        )
    return text


RUNS = Path("out") / Path(__file__).stem  # where runs go without --out_dir: RUNS/run_1, RUNS/run_2, ...


def parse_args():
    """The guide's flags plus a few of ours; --help shows every default."""
    parser = Parser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--epochs", type=positive_int, default=5, help="passes over the data")
    parser.add_argument("--batch_size", type=positive_int, default=64, help="samples per batch, per process")
    parser.add_argument("--lr", type=positive_float, default=0.02, help="learning rate (SGD, momentum 0.9)")
    parser.add_argument("--dataset_size", type=positive_int, default=2048, help="training samples")
    parser.add_argument(
        "--val_size", type=positive_int, default=512, help="held-out samples, evaluated each epoch"
    )
    parser.add_argument(
        "--grad_accum_steps",
        type=positive_int,
        default=1,
        help="micro-batches of --batch_size per optimizer step",
    )
    parser.add_argument(
        "--save_interval", type=positive_int, default=2, help="checkpoint every N epochs, and after the last"
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seeds the data, the initial weights, the shuffle"
    )
    parser.add_argument(
        "--out_dir",
        type=writable_dir,
        default=str(RUNS / "run_N"),
        help="where checkpoints and metrics go; run_N: a new folder each run (run_1, run_2, ...), and with "
        "--resume auto the latest one",
    )
    parser.add_argument(
        "--resume",
        metavar="PATH",
        help="a checkpoint to continue from, at its next epoch; 'auto': the latest in --out_dir if there is "
        "one, else start fresh (for restarts, requeued jobs, and continuing a run)",
    )
    parser.add_argument(
        "--hidden_size",
        type=positive_int,
        default=64,
        help="model width: wider means more compute for each byte of gradients exchanged",
    )
    # FSDP step 4: no --bucket_cap_mb: fully_shard reduce-scatters a block's gradients together
    parser.add_argument(
        "--num_workers",
        type=int,
        default=0,
        help="DataLoader worker processes; 0 is fastest for a dataset already in memory",
    )
    parser.add_argument(
        "--device", choices=["auto", "cuda", "cpu"], default="auto", help="auto: CUDA if a GPU is visible"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="record a few batches of the run's second epoch with torch.profiler: a trace per process in "
        "--out_dir, which ui.perfetto.dev opens (the training is the same; that epoch's time is not)",
    )
    args = parser.parse_args()
    if args.resume not in (None, "auto") and not complete(args.resume):  # FSDP step 6: or a folder
        parser.error(f"--resume {args.resume}: no whole checkpoint; pass a model_epoch_E(.pt) from --out_dir")
    if args.num_workers < 0:
        parser.error(f"--num_workers must be 0 or more, not {args.num_workers}")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: PyTorch sees no CUDA GPU on this machine; use --device cpu")
    if args.profile and args.epochs < 2:
        parser.error(
            "--profile records the second epoch, after the first has warmed up: pass --epochs 2 or more"
        )
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def check_launch(args):
    """What torchrun set for this process, checked before it waits on any other: RANK, LOCAL_RANK
    and WORLD_SIZE all (torchrun) or none (plain python), and no more processes on a node than
    GPUs. The baseline, one process under plain python, always passes."""
    missing = [name for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE") if name not in os.environ]
    if 0 < len(missing) < 3:  # some set by hand, or by another launcher; none: plain python
        raise Refused(f"{' and '.join(missing)} not set: launch with torchrun, which sets them all")
    if args.device == "cuda" and int(os.getenv("LOCAL_WORLD_SIZE", 1)) > torch.cuda.device_count():
        raise Refused(f"use --nproc_per_node={torch.cuda.device_count()} or fewer: one process per GPU")


def check_out_dir(args):
    """Runs never mix their files: a run into an --out_dir that holds checkpoints continues the
    latest of them, and a folder another run is writing to is refused. Every process checks,
    alike, before any of them waits on another. Sets args.out_dir to the run's folder (for run_N,
    the next N, or with --resume auto the latest), and args.resume to the checkpoint to start
    from, or None."""
    if Path(args.out_dir) == RUNS / "run_N":  # every process finds the same N: none is made before all met
        done = [int(p.name[4:]) for p in RUNS.glob("run_*") if p.name[4:].isdigit()]
        latest = max(done, default=0)
        args.out_dir = str(RUNS / f"run_{latest if args.resume == 'auto' and latest else latest + 1}")
    if args.resume == "auto":
        args.resume = latest_checkpoint(args.out_dir)
    check_continues(args)
    path = Path(args.out_dir) / "metrics.jsonl"
    if not path.exists():
        return
    lock(args).release()  # refused while a running job holds it (open_metrics, below)
    with open(path, "rb") as metrics:
        for number, line in enumerate(metrics, 1):  # a damaged history is refused before anything changes
            if line.endswith(b"\n"):  # a last line without one was cut short by a crash: it is redone
                try:
                    json.loads(line)["epoch"]
                except (ValueError, KeyError, TypeError):
                    raise Refused(
                        f"{path} line {number} is not an epoch's record: fix or remove that line"
                    ) from None


def lock(args):
    """Take --out_dir's lock, or refuse: a running job holds it. It waits a second, which lets the
    processes of one new job take it in turn to check (check_out_dir). The operating system drops
    it when its process ends, however it ends."""
    lock = filelock.FileLock(Path(args.out_dir) / ".lock")
    try:
        lock.acquire(timeout=1)
    except filelock.Timeout:
        raise Refused(
            f"--out_dir {args.out_dir} is in use by another run: wait for it, or choose another"
        ) from None
    return lock


def complete(path):
    # FSDP step 6: a whole file, model_epoch_E.pt, or a sharded checkpoint's folder, model_epoch_E, once
    # complete: DCP writes its .metadata last, after every rank's shards
    return Path(path).suffix == ".pt" and Path(path).is_file() or Path(path, ".metadata").is_file()


def latest_checkpoint(out_dir):
    # FSDP step 6: of one epoch, the folder, which every rank reads its own of
    saved = [p for p in Path(out_dir).glob("model_epoch_*") if complete(p)]  # not a cut save's .pt.tmp
    return str(max(saved, key=lambda p: (int(p.stem.split("_")[-1]), p.is_dir()))) if saved else None


def check_continues(args):
    """A run into an --out_dir that holds checkpoints must continue the latest of them."""
    latest = latest_checkpoint(args.out_dir)
    if latest and not (args.resume and Path(args.resume).resolve() == Path(latest).resolve()):
        raise Refused(
            f"--out_dir {args.out_dir} already holds {Path(latest).name} from an earlier run: add "
            f"--resume {latest} (or --resume auto) to continue that run, or choose another --out_dir"
        )


def check_epoch(args, batches):
    """An epoch must hold what the flags ask of it: a whole optimizer step, and --profile's steps."""
    if args.grad_accum_steps > batches:
        raise Refused(
            f"--grad_accum_steps {args.grad_accum_steps} is more than the {batches} batches of an epoch"
        )
    if args.profile and RECORDED[-1] > batches:
        raise Refused(
            f"--profile records batches {RECORDED[0]} to {RECORDED[-1]} of an epoch, which has {batches} "
            "here: pass a smaller --batch_size or a larger --dataset_size"
        )


def load_checkpoint(path, args, model, optimizer, device):
    """Continue from a checkpoint's weights, optimizer state and epoch; return the next epoch's index.
    Anything that does not fit this model and these flags is refused before training starts."""
    if not path:
        return 0
    try:
        # weights_only: a checkpoint is data, and loading one must never run code.
        # FSDP step 6: rank 0 alone reads a whole file, memory-mapped on its CPU: each tensor is read
        # from the file only as it is sent to the others (below). Of a sharded checkpoint, every rank
        # reads the epoch and config here, and its own shards below; DCP's format is a pickle, whose
        # index (.metadata) torch 2.13 unpickles without weights_only's guard (pytorch/pytorch#189308):
        # resume only from folders your own jobs wrote. Every rank takes rank 0's epoch and config.
        checkpoint = {"epoch": None, "config": {"hidden_size": None}}
        if path.endswith(".pt") and dist.get_rank() == 0:
            checkpoint = torch.load(path, mmap=True, map_location="cpu", weights_only=True)
        elif not path.endswith(".pt"):
            dcp.load(checkpoint, checkpoint_id=path)
        header = [{key: checkpoint[key] for key in ("epoch", "config")}]
        dist.broadcast_object_list(header)
        epoch, width = header[0]["epoch"], header[0]["config"]["hidden_size"]
    except (Exception, dcp.CheckpointException) as error:  # FSDP step 6: DCP's is a BaseException
        raise Refused(
            f"--resume {path}: refused, loading it would run code; ours hold only data"
            if "unsupported global" in str(error).lower()
            else f"--resume {path}: not a whole checkpoint of these scripts (empty, cut short, other)"
        ) from None
    if width != args.hidden_size:
        raise Refused(f"--resume {path} was trained with --hidden_size {width}: pass that too")
    if not isinstance(epoch, int) or epoch > args.epochs:
        raise Refused(
            f"--resume {path} has trained {epoch} epochs, more than --epochs {args.epochs}: pass more"
        )
    try:
        # FSDP step 6, the load: each rank's own shards, of the weights and of the optimizer's state,
        # keyed by name. Of a whole file: rank 0's tensors, each sent to every rank, which keeps its
        # own shard (WHOLE); its optimizer state renamed (by_name). Of a sharded checkpoint: every
        # rank reads its own shards, whatever world size saved them (DCP reshards them).
        model_sd, optim_sd = dsd.get_state_dict(model, optimizer)
        if path.endswith(".pt"):  # rank 0 alone holds the file's tensors: the others pass {}
            model_sd = checkpoint.get("model_state_dict", {})
            optim_sd = by_name(checkpoint["optimizer_state_dict"], optim_sd) if dist.get_rank() == 0 else {}
        else:
            dcp.load({"model_state_dict": model_sd, "optimizer_state_dict": optim_sd}, checkpoint_id=path)
        options = WHOLE if path.endswith(".pt") else None
        dsd.set_model_state_dict(model, model_sd, options=options)
        dsd.set_optimizer_state_dict(model, optimizer, optim_sd, options=options)
        for group in optimizer.param_groups:  # the momentum buffers must fit their weights
            for param in group["params"]:
                buffer = optimizer.state.get(param, {}).get("momentum_buffer")
                if buffer is not None and buffer.shape != param.shape:
                    raise ValueError(
                        f"a momentum buffer of shape {tuple(buffer.shape)} for {tuple(param.shape)}"
                    )
    except (KeyError, TypeError, ValueError, RuntimeError, dcp.CheckpointException) as error:  # FSDP step 6
        reason = str(error).strip().splitlines()[-1].strip()  # torch's last line names what does not fit
        raise Refused(f"--resume {path} does not fit this model: {reason}") from None
    return epoch  # epochs done, so the index of the next one


def save_checkpoint(args, model, optimizer, epoch):
    """Every --save_interval epochs, and after the last, write model_epoch_E.pt whole or not
    at all: to a temporary file, flushed to disk, then renamed over. A crash or a full disk
    leaves the previous checkpoints as they were, and no temporary file behind."""
    if epoch % args.save_interval and epoch != args.epochs:
        return
    # FSDP step 6: every rank writes its own shards, keyed by name, into the folder model_epoch_E,
    # in parallel: torch.distributed.checkpoint (DCP). Rank 0 writes the folder's index, .metadata,
    # last, once every rank's shards are on disk: a folder without it is a save cut short, which
    # latest_checkpoint passes over and the next save of that epoch writes over.
    checkpoint = {
        "epoch": epoch,
        "model_state_dict": model.state_dict(),  # a sharded model's: this rank's shards, DTensors
        "optimizer_state_dict": dsd.get_optimizer_state_dict(model, optimizer),  # theirs, by name
        "config": vars(args),
    }
    dcp.save(checkpoint, checkpoint_id=Path(args.out_dir) / f"model_epoch_{epoch}")
    # FSDP step 6: after the last epoch, also the whole model, in one file: every rank sends its
    # shards (a collective); rank 0 receives the whole tensors, on its CPU (WHOLE's cpu_offload), the
    # other ranks empty dicts, and rank 0 alone writes, as the other twins do
    whole = dsd.get_state_dict(model, optimizer, options=WHOLE) if epoch == args.epochs else None
    if whole is None or dist.get_rank() != 0:
        return
    checkpoint["model_state_dict"], checkpoint["optimizer_state_dict"] = whole
    path = Path(args.out_dir) / f"model_epoch_{epoch}.pt"
    temporary = path.with_name(path.name + ".tmp")
    try:
        with open(temporary, "wb") as file:  # a file of ours, so that errors come with their reason
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())  # on disk before the rename: a machine crash keeps it too
        os.replace(temporary, path)  # atomic
        if os.name == "posix":  # the rename itself, on disk (Windows cannot open a folder, nor needs to)
            folder = os.open(args.out_dir, os.O_RDONLY)
            os.fsync(folder)
            os.close(folder)
    except (OSError, RuntimeError) as error:  # torch wraps the file's own error (a full disk, say) in its own
        while error.__context__ and not isinstance(error, OSError):
            error = error.__context__
        raise Refused(f"could not save {path}: {error}; the earlier checkpoints are kept") from None
    finally:
        temporary.unlink(missing_ok=True)


# FSDP step 6: state dicts of whole tensors, not of shards. Saving, every rank sends its shards and
# rank 0 alone receives them, on its CPU (cpu_offload); loading, rank 0's tensors are sent to every
# rank (broadcast_from_rank0), which keeps its own shards of them. A workaround for torch 2.13, too:
# without broadcast_from_rank0, set_model_state_dict keeps the model's own tensor where a checkpoint
# lacks one, silently (pytorch/pytorch#153350); with it, it refuses, as load_state_dict does.
WHOLE = dsd.StateDictOptions(full_state_dict=True, cpu_offload=True, broadcast_from_rank0=True)


def by_name(state, named):
    """FSDP step 6: a whole file's optimizer state keyed by parameter name, as DCP's state-dict API
    keys it ("0.weight"). The baseline's and the DDP twin's files number the parameters, as
    optimizer.state_dict() does: by their place in the optimizer's groups, in order, the place where
    optimizer.load_state_dict puts each back. So number k becomes the k-th name of named, this
    optimizer's state dict from dsd.get_state_dict, whose groups name the parameters in that same
    order. Never model.named_parameters()'s order: with two groups (weight decay on some) the two
    differ, and momentum buffers of equal shapes would land on the wrong weights, silently. Names, of
    this twin's own files, stay as they are."""
    names = [name for group in named["param_groups"] for name in group["params"]]
    key = {**dict(enumerate(names)), **{name: name for name in names}}
    groups = [{**group, "params": [key[p] for p in group["params"]]} for group in state["param_groups"]]
    return {"state": {key[p]: value for p, value in state["state"].items()}, "param_groups": groups}


def open_metrics(args, start_epoch):
    """Start metrics.jsonl: lock --out_dir for this run (one run per folder at a time), and keep its
    history up to the checkpoint's epoch, cut back in one step, so that no crash can lose or break it.
    Under the lock, also remove what a killed save left, and say when there is nothing to train."""
    os.makedirs(args.out_dir, exist_ok=True)
    held = lock(args)
    print(f"{Path(__file__).name}: writing to {args.out_dir}")
    path = Path(args.out_dir) / "metrics.jsonl"
    metrics = open(path, "a+b")  # opening never truncates, and every write goes to the end
    metrics.lock = held  # held as long as the file is open: until this process ends
    check_continues(args)  # again, under the lock: a run started at the same time may have saved since
    metrics.seek(0)
    keep = 0  # bytes: the records of the epochs up to start_epoch (check_out_dir read them all)
    for line in metrics if start_epoch else ():
        if not line.endswith(b"\n") or json.loads(line)["epoch"] > start_epoch:
            break
        keep += len(line)
    metrics.truncate(keep)  # the epochs after the checkpoint's are redone
    for stale in Path(args.out_dir).glob("model_epoch_*.pt.tmp"):
        stale.unlink()  # a save cut short by a killed process
    if start_epoch == args.epochs:  # nothing to train: say so
        print(
            f"{Path(__file__).name}: {args.resume} has done all {args.epochs} epochs; raise --epochs for more"
        )
    if args.profile and args.epochs - start_epoch < 2:  # and nothing to record
        print(f"{Path(__file__).name}: --profile records the run's second epoch, and this run has none")
    return metrics


def check_finite(record):
    """Stop a diverged run: its loss is no longer a number, and neither are its weights."""
    if not (math.isfinite(record["loss"]) and math.isfinite(record["val_loss"])):
        raise Refused(
            f"epoch {record['epoch']}: the loss is {record['loss']} (held out: {record['val_loss']}), "
            "the run diverged; no checkpoint of this epoch was saved: try a smaller --lr"
        )


def refuse(refusal):
    """Print a refusal as one line and exit with argparse's code for usage errors. Under torchrun every
    process refuses alike and local rank 0 speaks at once; the others give torchrun a few seconds to
    stop them, and speak only if it does not (a refusal that is theirs alone)."""
    if os.getenv("LOCAL_RANK", "0") != "0":
        time.sleep(5)
    print(f"{Path(__file__).name}: error: {refusal}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    # at once, without Python's shutdown: nothing is left to finish, and in torch 2.13 that shutdown
    # can abort a process whose worker threads are still alive (pytorch/pytorch#190489)
    os._exit(2)


def report(record, metrics, epochs, elapsed):
    print(
        f"epoch {record['epoch']}/{epochs}  loss {record['loss']:.4f}  val_loss {record['val_loss']:.4f}  "
        f"{record['samples_per_sec']:,.0f} samples/s  elapsed {elapsed:.1f}s"
    )
    metrics.write(json.dumps(record, allow_nan=False).encode() + b"\n")
    metrics.flush()


# the batches of an epoch that --profile records, counted from 1: the first is skipped, the profiler
# warms up on the second
RECORDED = range(3, 7)


def profiled(loader, args, record):
    """The batches of loader, as they come. With --profile, and record, torch.profiler records a
    few of them (RECORDED: each from its fetch through forward, backward and, on the last
    micro-batch of an optimizer step, that step), and each process writes its trace to --out_dir
    as trace_rank<RANK>.json, in the format ui.perfetto.dev and chrome://tracing open. Each process
    records its own: gloo's all-reduces show on gloo's threads, nccl's on a CUDA stream of their
    own (a stream: a queue of GPU work, run in order, beside the compute's)."""
    if not (args.profile and record):
        yield from loader
        return
    rank = int(os.environ.get("RANK", 0))  # every process writes its own trace; rank 0 says where

    def write(profiler):
        os.makedirs(args.out_dir, exist_ok=True)  # rank 0 made it, but maybe on another node's disk
        profiler.export_chrome_trace(str(Path(args.out_dir) / f"trace_rank{rank}.json"))
        if rank == 0:
            where = Path(args.out_dir) / "trace_rank*.json"
            print(
                f"{Path(__file__).name}: --profile: batches {RECORDED[0]} to {RECORDED[-1]} of this epoch, a "
                f"trace per process: {where} (open one in ui.perfetto.dev)",
                flush=True,
            )

    # torch 2.13's profiler (kineto) prints "profiler_start" and "profiler_stop" at a level above its
    # errors (pytorch/kineto#1325); a level above every one keeps them out of our output; yours wins
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")
    activities = [torch.profiler.ProfilerActivity.CPU]
    if args.device == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    schedule = torch.profiler.schedule(wait=RECORDED[0] - 2, warmup=1, active=len(RECORDED), repeat=1)
    with torch.profiler.profile(activities=activities, schedule=schedule, on_trace_ready=write) as profiler:
        for batch in loader:
            yield batch
            profiler.step()  # the profiler's step is our batch: the next begins with its fetch


# -----------------------------------------------------------------------------
# the distributed scripts' alone (train_ddp.py, train_fsdp.py), not the lesson (DDP step 1, optional)


def one_process_group(backend):
    """A process group of this one process, for a job started without torchrun. Here, and only
    here, the script names where to meet, its rank and the world size itself, as check_ddp.py
    (DDP105, DDP106) tells a script under torchrun never to: without torchrun, nothing set RANK or
    MASTER_ADDR, and no store waits to be met at. It meets at a file, not a port: native Windows,
    where torchrun's store does not run, runs it too. mkstemp makes the file, new and ours alone
    (mktemp's name could be taken before it is used); torch deletes it with the group."""
    print(f"{Path(__file__).name}: not started by torchrun, so running as a one-process job (world size 1)")
    handle, store = tempfile.mkstemp(prefix=f"{Path(__file__).stem}-group-")
    os.close(handle)
    dist.init_process_group(backend, init_method=Path(store).as_uri(), rank=0, world_size=1)


if __name__ == "__main__":
    try:
        args = parse_args()
        check_launch(args)  # before any process waits on another
        check_out_dir(args)
        train(args)
        # torch 2.13 imports parts of itself lazily, and some of them keep the frames that imported
        # them in a reference cycle (pytorch/pytorch#195586): train()'s, with its model, among them.
        # Collect it now, while Python is whole, not as it shuts down (pytorch/pytorch#190489).
        gc.collect()
    except Refused as refusal:
        refuse(refusal)
