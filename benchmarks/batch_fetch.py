"""What fetching batches whole saves: the twins' DataLoader against the usual one, on their own data.

    python benchmarks/batch_fetch.py                          # the scripts' defaults: 2048 samples, batch 64
    python benchmarks/batch_fetch.py --batch_size 1024 --dataset_size 32768 --rounds 9
    python benchmarks/batch_fetch.py --keep benchmarks/batch_fetch.kept.json   # the page's figures

Both scripts hand their DataLoader a BatchSampler and batch_size=None, so that each batch is one
indexing op, dataset[list of indices]. The usual DataLoader(dataset, batch_size=B) calls
dataset[i] B times and stacks the B samples (default_collate). This times one epoch of each,
loading only (no model), shuffled as the scripts shuffle, in one process with one thread (as
torchrun gives each worker); every round runs both, in an order that alternates, and it prints
each round, the median of each, and the ratio within each round. No test asserts these times; --keep
writes them, with the date, the machine and its load, to a JSON file, from which
tests/test_figures.py reads the page's figures.
"""

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.utils.data import BatchSampler, DataLoader, RandomSampler

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from environment import Kept  # noqa: E402  benchmarks/environment.py

from single_gpu_baseline import make_data  # noqa: E402  the scripts' own data

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--dataset_size", type=int, default=2048, help="samples (default: 2048, the scripts')")
parser.add_argument("--batch_size", type=int, default=64, help="samples a batch (default: 64, the scripts')")
parser.add_argument("--rounds", type=int, default=7, help="rounds of both loaders (default: 7)")
parser.add_argument("--epochs", type=int, default=50, help="epochs timed in each round (default: 50)")
parser.add_argument(
    "--keep", metavar="FILE", help="also write the output, date, machine and load to FILE (JSON)"
)
args = parser.parse_args()
out = Kept(args.keep)
torch.set_num_threads(1)

dataset, _ = make_data(SimpleNamespace(seed=0, dataset_size=args.dataset_size, val_size=1))
loaders = {
    # the scripts': a BatchSampler yields lists of indices, and each is one dataset[indices]
    "whole": DataLoader(
        dataset,
        sampler=BatchSampler(RandomSampler(dataset), args.batch_size, drop_last=False),
        batch_size=None,
    ),
    # the usual: batch_size dataset[i] calls, then default_collate stacks them
    "items": DataLoader(dataset, batch_size=args.batch_size, sampler=RandomSampler(dataset)),
}
first = {name: next(iter(loader)) for name, loader in loaders.items()}  # the same batches, in shape
for loader in loaders.values():  # a warm-up epoch each: the first is slower
    for _batch in loader:
        pass
assert [t.shape for t in first["whole"]] == [t.shape for t in first["items"]], first


def epochs_per_second(loader):
    start = time.perf_counter()
    for _ in range(args.epochs):
        for _batch in loader:
            pass
    return args.epochs / (time.perf_counter() - start)


rounds = []
for r in range(args.rounds):
    speed = {
        name: epochs_per_second(loaders[name]) for name in (list(loaders)[r % 2 :] + list(loaders)[: r % 2])
    }
    rounds.append(speed)
    out.say(
        f"round {r + 1}: whole {speed['whole'] * args.dataset_size:,.0f} samples/s, "
        f"items {speed['items'] * args.dataset_size:,.0f} samples/s"
    )

out.say(
    f"\n{args.dataset_size} samples, batch {args.batch_size}, {args.epochs} epochs a round, "
    f"{args.rounds} rounds; torch {torch.__version__}, 1 thread"
)
for name in loaders:
    values = [one[name] * args.dataset_size for one in rounds]
    low, high = min(values), max(values)
    out.say(f"{name:5}  median {statistics.median(values):,.0f} samples/s  ({low:,.0f} to {high:,.0f})")
ratios = [one["whole"] / one["items"] for one in rounds]
low, high = min(ratios), max(ratios)
out.say(f"whole / items, per round: median {statistics.median(ratios):.1f}x ({low:.1f} to {high:.1f})")
samples_per_s = [{name: one[name] * args.dataset_size for name in one} for one in rounds]
out.save(f"{os.cpu_count()}-core {platform.machine()} CPU", rounds=samples_per_s, whole_over_items=ratios)
