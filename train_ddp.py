"""Train a small regression model with DistributedDataParallel (DDP), in 10 steps.

DDP step 8: launch with torchrun. It starts one copy of this script per process
(one per GPU, or several on a CPU) and tells each copy who it is.

    torchrun --standalone --nproc_per_node=2 train_ddp.py
    torchrun --standalone --nproc_per_node=2 train_ddp.py --epochs 10 --batch_size 32
    python train_ddp.py        # without torchrun: a one-process job

Two nodes: run this on each, with HOST the address of the first (see README.md):

    torchrun --nnodes=2 --nproc_per_node=4 --rdzv-backend=c10d --rdzv-endpoint=HOST:29500 train_ddp.py

The same command runs on GPUs (nccl) and on CPUs (gloo). Its single-process twin
is single_gpu_baseline.py: `diff -u single_gpu_baseline.py train_ddp.py` shows
only the DDP steps, each named.
"""

import argparse
import atexit  # DDP step 7: clean up on the way out
import contextlib  # DDP step 9
import gc  # DDP step 7
import json
import math
import os
import sys  # DDP step 8
import time
from datetime import timedelta  # DDP step 1: the process group's timeout
from pathlib import Path

import torch
import torch.distributed as dist  # DDP step 1: the process group and its collectives
from torch.nn.parallel import DistributedDataParallel as DDP  # DDP step 4
from torch.utils.data import BatchSampler, DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler  # DDP step 3


# -----------------------------------------------------------------------------
# command line: the guide's flags plus a few of ours; --help shows every default
def positive_int(text):
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number of at least 1, not {text}")
    return value


def writable_dir(text):
    path = Path(text).absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK):
        raise argparse.ArgumentTypeError(
            f"cannot create or write {text}: {existing} is not a writable folder"
        )
    return text


def positive_float(text):
    value = float(text)
    if not 0 < value < math.inf:  # also refuses nan
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, not {text}")
    return value


parser = argparse.ArgumentParser(
    description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
)
parser.add_argument("--epochs", type=positive_int, default=5, help="passes over the data")
parser.add_argument("--batch_size", type=positive_int, default=64, help="samples per step, per process")
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
parser.add_argument("--seed", type=int, default=0, help="seeds the data, the initial weights, the shuffle")
parser.add_argument(
    "--out_dir",
    type=writable_dir,
    default=f"out/{Path(__file__).stem}",
    help="where checkpoints and metrics.jsonl go",
)
parser.add_argument("--resume", metavar="PATH", help="a checkpoint to continue from, at its next epoch")
parser.add_argument(
    "--hidden_size",
    type=positive_int,
    default=64,
    help="model width: wider means more compute for each byte of gradients exchanged",
)
parser.add_argument(
    "--num_workers",
    type=int,
    default=0,
    help="DataLoader worker processes; 0 is fastest for a dataset already in memory",
)
parser.add_argument(
    "--device", choices=["auto", "cuda", "cpu"], default="auto", help="auto: CUDA if a GPU is visible"
)
args = parser.parse_args()
if args.resume and not os.path.isfile(args.resume):
    parser.error(f"--resume {args.resume}: no such file; pass a model_epoch_E.pt from a run's --out_dir")
if args.num_workers < 0:
    parser.error(f"--num_workers must be 0 or more, not {args.num_workers}")

# checkpoints of an earlier run in --out_dir: a fresh run must not mix its files with them
saved = sorted(Path(args.out_dir).glob("model_epoch_*.pt"), key=lambda p: int(p.stem.split("_")[-1]))
# DDP step 6: torchrun --max-restarts=K restarts every worker when one fails; a
# restart (TORCHELASTIC_RESTART_COUNT > 0) continues from the latest checkpoint by itself
if int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0 and saved:
    args.resume = str(saved[-1])
if saved and not (args.resume and Path(args.resume).resolve() == saved[-1].resolve()):
    parser.error(
        f"--out_dir {args.out_dir} already holds {saved[-1].name} from an earlier run: "
        f"add --resume {saved[-1]} to continue that run, or choose another --out_dir"
    )

use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
if use_cuda and not torch.cuda.is_available():
    parser.error("--device cuda: PyTorch sees no CUDA GPU on this machine; use --device cpu")

# -----------------------------------------------------------------------------
# DDP step 1: init the process group
# torchrun tells each process who it is: RANK (0 .. WORLD_SIZE-1 over all nodes),
# LOCAL_RANK (its index on this node), WORLD_SIZE, and MASTER_ADDR/MASTER_PORT of
# the rendezvous. We never set these ourselves: the guide's hard-coded
# MASTER_PORT=12355 overrides torchrun's own, and the workers hang.
if "RANK" not in os.environ:
    print("train_ddp.py: not started by torchrun, so running as a one-process job (world size 1)")
    # port 0 takes any free port: no other process needs to find this one
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0")
rank = int(os.environ["RANK"])
local_rank = int(os.environ["LOCAL_RANK"])
world_size = int(os.environ["WORLD_SIZE"])
# DDP step 8: torch 2.13's torchrun keeps its rendezvous store across restarts, and a
# restarted worker may read a dead peer's address from it and fail to connect
if rank == 0 and os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") != "0":
    if os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1":
        print(
            "train_ddp.py: warning: with --max-restarts, set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
            file=sys.stderr,
        )
# mistakes are caught here, in every process alike, before any process waits on another
if use_cuda and local_rank >= torch.cuda.device_count():
    parser.error(
        f"{torch.cuda.device_count()} GPU(s) on this node but LOCAL_RANK is {local_rank}: "
        f"use --nproc_per_node={torch.cuda.device_count()} or fewer"
    )
if args.dataset_size < world_size:
    parser.error(f"--dataset_size {args.dataset_size} leaves some of the {world_size} processes no data")
dist.init_process_group(
    backend="nccl" if use_cuda else "gloo",  # nccl between GPUs, gloo between CPUs
    device_id=local_rank if use_cuda else None,  # DDP step 2: bind nccl to this process's GPU now
    timeout=timedelta(seconds=60),  # a rank stuck for a minute fails the job instead of hanging it
)


def cleanup():
    # DDP step 7: clean up, on the way out, errors included (atexit, below). Drop the
    # DDP model first: it holds the process group, and gloo's threads, if they outlive
    # the interpreter, abort the process as it exits (torch 2.13: "terminate called
    # without an active exception", a failed job after a good run).
    globals().pop("model", None)
    gc.collect()
    dist.destroy_process_group()


atexit.register(cleanup)

# -----------------------------------------------------------------------------
# DDP step 2: place each process on its device
# LOCAL_RANK numbers the GPUs of this node. The guide uses the global rank, which
# asks for cuda:4 on the second node of a 2 x 4 GPU job: a GPU that is not there.
device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
if use_cuda:
    torch.cuda.set_device(device)  # so kernels, pinned memory and caches use this GPU

# -----------------------------------------------------------------------------
# data: a task the model can learn, y = sin(x . w) + noise, drawn from one seeded
# generator, so every process builds the very same dataset (the guide's unseeded
# torch.randn gives each rank different data, and random labels nothing can learn)
in_features = 10
data_gen = torch.Generator().manual_seed(args.seed)
w = torch.randn(in_features, 1, generator=data_gen) / math.sqrt(in_features)  # the hidden function


def draw(n):  # n samples of the task; the noise makes 0.01 the lowest loss reachable
    x = torch.randn(n, in_features, generator=data_gen)
    return TensorDataset(x, torch.sin(x @ w) + 0.1 * torch.randn(n, 1, generator=data_gen))


dataset = draw(args.dataset_size)
val_set = draw(args.val_size)  # held out: drawn after the training data, so disjoint from it
# DDP step 3: shard the data. Each epoch, every rank draws the same seeded shuffle
# and keeps every world_size-th index from its rank on: disjoint shards that cover
# the data (padded with repeats when world_size does not divide it). So N processes
# at batch B visit the same global batches as the baseline at batch N x B.
sampler = DistributedSampler(dataset, seed=args.seed)
# batches come whole, as dataset[list of indices]: one indexing op each, instead of
# batch_size __getitem__ calls and a collate (4x faster for data already in memory)
batches = BatchSampler(sampler, args.batch_size, drop_last=False)
loader = DataLoader(
    dataset, sampler=batches, batch_size=None, num_workers=args.num_workers, pin_memory=use_cuda
)
val_sampler = DistributedSampler(val_set, shuffle=False)  # DDP step 10: each rank evaluates its shard
val_count = len(range(rank, args.val_size, world_size))  # DDP step 10: its real samples, without repeats
val_batches = BatchSampler(val_sampler, args.batch_size, drop_last=False)
val_loader = DataLoader(val_set, sampler=val_batches, batch_size=None, pin_memory=use_cuda)
if args.grad_accum_steps > len(loader):
    parser.error(
        f"--grad_accum_steps {args.grad_accum_steps} is more than the {len(loader)} batches of an epoch"
    )

# -----------------------------------------------------------------------------
# model and optimizer: seeded, so every run starts from the same weights
torch.manual_seed(args.seed)
model = torch.nn.Sequential(
    torch.nn.Linear(in_features, args.hidden_size),
    torch.nn.ReLU(),
    torch.nn.Linear(args.hidden_size, args.hidden_size),
    torch.nn.ReLU(),
    torch.nn.Linear(args.hidden_size, 1),
).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
loss_fn = torch.nn.MSELoss()

# resume: continue from a checkpoint's weights, optimizer state and epoch
start_epoch = 0
if args.resume:
    # weights_only: a checkpoint is data, and loading one must never run code.
    # map_location: straight onto this process's device, whatever device saved it.
    try:
        checkpoint = torch.load(args.resume, map_location=device, weights_only=True)
        saved_width = checkpoint["config"]["hidden_size"]
    except Exception as error:  # torch's own messages do not say which of these it is
        parser.error(
            f"--resume {args.resume}: refused, loading it would run code; ours hold only data"
            if "unsupported GLOBAL" in str(error)
            else f"--resume {args.resume}: not a whole checkpoint of these scripts (empty, cut short, other)"
        )
    if saved_width != args.hidden_size:
        parser.error(f"--resume {args.resume} was trained with --hidden_size {saved_width}: pass that too")
    model.load_state_dict(checkpoint["model_state_dict"])
    optimizer.load_state_dict(checkpoint["optimizer_state_dict"])
    start_epoch = checkpoint["epoch"]  # epochs done, so the index of the next one
    dist.barrier()  # DDP step 6: every rank has loaded before any rank trains

# -----------------------------------------------------------------------------
# DDP step 4: wrap the model
# DDP copies rank 0's weights to every rank now; then, during each backward(), it
# all-reduces the gradients to their mean across ranks, bucket by bucket, while
# the rest of the backward pass runs. A checkpoint is loaded above, into the bare
# model, before this. device_ids names this process's one GPU; on a CPU there is none.
model = DDP(model, device_ids=[local_rank] if use_cuda else None)

# -----------------------------------------------------------------------------
# training loop
if rank == 0:  # DDP step 6: only rank 0 writes files
    os.makedirs(args.out_dir, exist_ok=True)
    metrics_path = Path(args.out_dir) / "metrics.jsonl"
    old = metrics_path.read_text().splitlines(keepends=True) if metrics_path.exists() else []
    metrics = open(metrics_path, "w")  # keeps the epochs up to the checkpoint's; a restart redoes the rest
    metrics.writelines(
        line for line in old if line.endswith("\n") and json.loads(line)["epoch"] <= start_epoch
    )
start = time.perf_counter()
for epoch in range(start_epoch, args.epochs):
    sampler.set_epoch(epoch)  # DDP step 3: a new shuffle each epoch, the same one on every rank
    model.train()
    epoch_start = time.perf_counter()
    # the loss is summed on the device as (loss x samples): no .item() per step,
    # which would stall a GPU every step, and the mean stays exact for a short last batch
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    samples = 0
    for step, (xb, yb) in enumerate(loader):
        xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        # --grad_accum_steps K: K micro-batches make one optimizer step, each loss
        # divided by K so that the step is that of one batch K times as large
        last = (step + 1) % args.grad_accum_steps == 0 or step + 1 == len(loader)
        # DDP step 9: accumulate gradients with no_sync. Inside model.no_sync(), backward()
        # keeps its gradients local: they are all-reduced once, on the last micro-batch
        # of the step, not K times
        with contextlib.nullcontext() if last else model.no_sync():
            loss = loss_fn(model(xb), yb)
            (loss / args.grad_accum_steps).backward()
        if last:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        loss_sum += loss.detach() * len(xb)
        samples += len(xb)
    totals = torch.stack([loss_sum, loss_sum.new_tensor(samples)])
    # DDP step 5: all-reduce the metrics. Sum (loss x samples, samples) over all ranks,
    # once per epoch: the exact mean over every sample seen. The guide averages per-step
    # means over num_batches * world_size, which is wrong when the last batch is short.
    dist.all_reduce(totals)
    loss_total, samples_total = totals.tolist()  # waits for the device, so the clock is honest
    seconds = time.perf_counter() - epoch_start

    # evaluate on the held-out set: the mean loss over each of its samples, once
    model.eval()
    val_sum = torch.zeros((), dtype=torch.float64, device=device)
    val_samples = 0
    with torch.no_grad():
        for xb, yb in val_loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            # DDP step 10: evaluate exactly. The sampler pads this rank's shard with repeats
            # past its val_count real samples: they are cut off, so none counts twice
            xb, yb = xb[: val_count - val_samples], yb[: val_count - val_samples]
            val_sum += torch.nn.functional.mse_loss(model.module(xb), yb, reduction="sum")
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
        "world_size": world_size,  # DDP step 5
        "backend": dist.get_backend(),  # DDP step 5
        "device": str(device),
    }
    if rank == 0:  # DDP step 5: one process reports for all
        print(
            f"epoch {epoch + 1}/{args.epochs}  loss {record['loss']:.4f}  val_loss {record['val_loss']:.4f}  "
            f"{record['samples_per_sec']:,.0f} samples/s  elapsed {time.perf_counter() - start:.1f}s"
        )
        print(json.dumps(record), file=metrics, flush=True)

    # DDP step 6: checkpoint on rank 0. Only rank 0 saves, and saves the unwrapped model
    # (model.module): no "module." prefix, so the baseline and any world size load it.
    # Never put a collective in a rank-0-only block: the other ranks would not reach it,
    # and the job would hang.
    if rank == 0 and ((epoch + 1) % args.save_interval == 0 or epoch + 1 == args.epochs):
        checkpoint = {
            "epoch": epoch + 1,
            "model_state_dict": model.module.state_dict(),
            "optimizer_state_dict": optimizer.state_dict(),
            "config": vars(args),
        }
        path = os.path.join(args.out_dir, f"model_epoch_{epoch + 1}.pt")
        torch.save(checkpoint, path + ".tmp")
        os.replace(path + ".tmp", path)  # atomic: a crash mid-write leaves no broken checkpoint
