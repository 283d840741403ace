"""Train a small regression model on one device: the single-process baseline.

    python single_gpu_baseline.py
    python single_gpu_baseline.py --epochs 10 --batch_size 64

It runs on a GPU if there is one, else on the CPU (see --device). Its DDP twin is
train_ddp.py: `diff -u single_gpu_baseline.py train_ddp.py` shows only the DDP
steps, each named.
"""

import argparse
import json
import math
import os
import time
from pathlib import Path

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler, SequentialSampler, TensorDataset


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
if saved and not (args.resume and Path(args.resume).resolve() == saved[-1].resolve()):
    parser.error(
        f"--out_dir {args.out_dir} already holds {saved[-1].name} from an earlier run: "
        f"add --resume {saved[-1]} to continue that run, or choose another --out_dir"
    )

use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
if use_cuda and not torch.cuda.is_available():
    parser.error("--device cuda: PyTorch sees no CUDA GPU on this machine; use --device cpu")

device = torch.device("cuda" if use_cuda else "cpu")

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
# shuffle each epoch with a seeded generator (reseeded below), by the same rule as
# DistributedSampler, so that this baseline matches train_ddp.py batch for batch
sampler_gen = torch.Generator()
sampler = RandomSampler(dataset, generator=sampler_gen)
# batches come whole, as dataset[list of indices]: one indexing op each, instead of
# batch_size __getitem__ calls and a collate (4x faster for data already in memory)
batches = BatchSampler(sampler, args.batch_size, drop_last=False)
loader = DataLoader(
    dataset, sampler=batches, batch_size=None, num_workers=args.num_workers, pin_memory=use_cuda
)
val_sampler = SequentialSampler(val_set)
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

# -----------------------------------------------------------------------------
# training loop
os.makedirs(args.out_dir, exist_ok=True)
metrics_path = Path(args.out_dir) / "metrics.jsonl"
old = metrics_path.read_text().splitlines(keepends=True) if metrics_path.exists() else []
metrics = open(metrics_path, "w")  # keeps the epochs up to the checkpoint's; a restart redoes the rest
metrics.writelines(line for line in old if line.endswith("\n") and json.loads(line)["epoch"] <= start_epoch)
start = time.perf_counter()
for epoch in range(start_epoch, args.epochs):
    sampler_gen.manual_seed(args.seed + epoch)  # a new shuffle each epoch, reproducible
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
        loss = loss_fn(model(xb), yb)
        (loss / args.grad_accum_steps).backward()
        if last:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        loss_sum += loss.detach() * len(xb)
        samples += len(xb)
    totals = torch.stack([loss_sum, loss_sum.new_tensor(samples)])
    loss_total, samples_total = totals.tolist()  # waits for the device, so the clock is honest
    seconds = time.perf_counter() - epoch_start

    # evaluate on the held-out set: the mean loss over each of its samples, once
    model.eval()
    val_sum = torch.zeros((), dtype=torch.float64, device=device)
    val_samples = 0
    with torch.no_grad():
        for xb, yb in val_loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            val_sum += torch.nn.functional.mse_loss(model(xb), yb, reduction="sum")
            val_samples += len(xb)
    val_totals = torch.stack([val_sum, val_sum.new_tensor(val_samples)])
    val_total, val_samples_total = val_totals.tolist()
    record = {
        "epoch": epoch + 1,
        "loss": loss_total / samples_total,
        "val_loss": val_total / val_samples_total,
        "samples": int(samples_total),
        "seconds": seconds,
        "samples_per_sec": samples_total / seconds,
        "world_size": 1,
        "backend": None,
        "device": str(device),
    }
    print(
        f"epoch {epoch + 1}/{args.epochs}  loss {record['loss']:.4f}  val_loss {record['val_loss']:.4f}  "
        f"{record['samples_per_sec']:,.0f} samples/s  elapsed {time.perf_counter() - start:.1f}s"
    )
    print(json.dumps(record), file=metrics, flush=True)

    # save a checkpoint every --save_interval epochs, and after the last
    if (epoch + 1) % args.save_interval == 0 or epoch + 1 == args.epochs:
        checkpoint = {
            "epoch": epoch + 1,
            "model_state_dict": model.state_dict(),
            "optimizer_state_dict": optimizer.state_dict(),
            "config": vars(args),
        }
        path = os.path.join(args.out_dir, f"model_epoch_{epoch + 1}.pt")
        torch.save(checkpoint, path + ".tmp")
        os.replace(path + ".tmp", path)  # atomic: a crash mid-write leaves no broken checkpoint
