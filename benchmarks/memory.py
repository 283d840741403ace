"""What FSDP2 saves, and what it costs, measured on each rank: what it holds between steps, the peak of
a training step, the bytes it sends and the time, for DDP and FSDP2 at N = 2 and 4 processes.

    python benchmarks/memory.py                                  # minutes on 2 CPU cores
    python benchmarks/memory.py --nprocs 2 --repeats 1           # one quick round
    python benchmarks/memory.py --keep benchmarks/memory.kept.json   # docs/fsdp.md's figures
    python benchmarks/memory.py --device cuda --nprocs 1         # on a GPU, with its allocator's peak too

Two models, each at batch 64 a process: ours, the twins' (train_fsdp.py's make_model at --hidden_size
1024: three Linear layers, the middle one 99 % of the weights), and one of 8 equal blocks (each a
1024 x 1024 Linear and a ReLU), the shape of a transformer's stack. Each is wrapped as the twins wrap
it: DDP, or fully_shard on each Linear, then on the root; SGD with momentum. The cases:

- DDP; FSDP2 as train_fsdp.py runs it (reshard_after_forward=True: a block's gathered weights freed
  after its forward, gathered again for its backward); FSDP2 with reshard_after_forward=False (kept
  from forward to backward: one all-gather less a block, its whole weights held meanwhile);
- accumulation, 2 micro-batches of 32 to a step: DDP with no_sync; FSDP2 reduce-scattering every
  micro-batch; FSDP2 with set_requires_gradient_sync(False) until the last (train_fsdp.py's FSDP step
  9: each rank keeps whole gradients between micro-batches); and with set_reshard_after_backward(False)
  as well (keeps whole weights too, to skip the next forward's all-gathers).

Measured on each rank, with torch's own memory trackers (torch.distributed._tools: MemTracker for DDP,
FSDPMemTracker for FSDP2), which see every tensor the step makes or touches, on a CPU as on a GPU:

- held: the parameters, gradients and optimizer state (SGD's momentum) the optimizer holds at its
  step, a DTensor (FSDP2's shard) by the part this rank stores;
- peak: the most the step holds at once, all of it: those, DDP's gradient buckets, the weights and
  gradients FSDP2 gathers whole for a block, the activations, the temporaries;
- on a GPU, also torch.cuda.max_memory_allocated over the step (the allocator's own peak);
- sent: the bytes this rank sends a step, as a ring algorithm sends each collective the step makes
  (seen as it is called): an all-reduce 2(N-1)/N of its tensor, an all-gather or a reduce-scatter
  (N-1)/N of the whole (gloo, on a CPU, runs a reduce-scatter as an all-reduce: it sends more);
- step ms: the median of --steps steps, after 2 to warm up, each started together (a barrier).

What a rank holds at its step and the bytes it sends are the same in every round (a round that says
otherwise stops the benchmark); the peak may differ by a buffer or so, with the moment an exchange's
buffer is freed: each rank's is the most of its rounds, and every round's is kept. The times vary,
and are given as the median of the rounds' medians, with their min and max. Each process
gets one thread (OMP_NUM_THREADS=1). --keep writes what it printed, with the date, the machine and its
load, to a small JSON file, from which tests/test_figures.py reads the pages' figures. No test asserts
a number.
"""

import argparse
import json
import os
import platform
import runpy
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from environment import Kept  # benchmarks/environment.py

ROOT = Path(__file__).resolve().parent.parent
BATCH, WIDTH, BLOCKS, MICRO = 64, 1024, 8, 2
MODELS = {
    "ours": f"train_fsdp.py's make_model, --hidden_size {WIDTH}",
    "blocks": f"{BLOCKS} equal blocks, each a {WIDTH} x {WIDTH} Linear and a ReLU",
}
# (name, wrapper, reshard_after_forward, micro-batches a step, how FSDP2 accumulates), in the order shown
CASES = [
    ("DDP", "DDP", None, 1, None),
    ("FSDP2", "FSDP2", True, 1, None),
    ("FSDP2, reshard_after_forward=False", "FSDP2", False, 1, None),
    ("DDP, 2 micro-batches, no_sync", "DDP", None, MICRO, "no_sync"),
    ("FSDP2, 2 micro-batches, reduce-scatter each", "FSDP2", True, MICRO, "each"),
    ("FSDP2, 2 micro-batches, set_requires_gradient_sync(False)", "FSDP2", True, MICRO, "no_sync"),
    ("FSDP2, 2 micro-batches, and set_reshard_after_backward(False)", "FSDP2", True, MICRO, "keep"),
]


# what a rank measures that may differ by a buffer between rounds (the order in which an exchange's buffers
# are freed); the rest (what it holds at its step, what it sends) is the same in every round
PEAKS = ("peak", "cuda_peak")


# The worker: one process of a torchrun job, running every case for its N ------------------------------


def build(name):
    if name == "ours":
        make_model = runpy.run_path(str(ROOT / "train_fsdp.py"))["make_model"]
        return make_model(argparse.Namespace(hidden_size=WIDTH)), 10, 1
    layers = [layer for _ in range(BLOCKS) for layer in (torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU())]
    return torch.nn.Sequential(*layers), WIDTH, WIDTH


def stored(tensor):
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


class Sent(torch.utils._python_dispatch.TorchDispatchMode):
    """The bytes this rank sends in the collectives it calls (c10d's ops), as a ring algorithm sends them."""

    def __init__(self, world):
        super().__init__()
        self.world, self.bytes, self.calls = world, 0, {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        share = (self.world - 1) / self.world
        if func.namespace == "c10d" and name in ("allreduce_", "_allgather_base_", "_reduce_scatter_base_"):
            tensor = args[0][0] if name == "allreduce_" else args[0 if name == "_allgather_base_" else 1]
            self.bytes += stored(tensor) * (2 * share if name == "allreduce_" else share)
            self.calls[name] = self.calls.get(name, 0) + 1
        return func(*args, **(kwargs or {}))


def worker(args):
    import torch.distributed as dist

    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", device_id=device.index)
    mesh = dist.init_device_mesh(device.type, (dist.get_world_size(),))
    for model in MODELS:
        for case in CASES:
            line = measure(model, *case, device, mesh, args.steps)
            sys.stdout.write(f"MEMORY {json.dumps(line)}\n")  # one write: the ranks share a pipe
            sys.stdout.flush()
    dist.destroy_process_group()


def measure(model_name, label, wrapper, reshard, micro, accumulate, device, mesh, steps):
    """One case on this rank: what it holds, its peak, what it sends, its step time."""
    import torch.distributed as dist
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model, inputs, outputs = build(model_name)
    model = model.to(device)
    if wrapper == "DDP":
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    else:
        for block in model:
            if isinstance(block, torch.nn.Linear):
                fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh)  # the root: as train_fsdp.py shards it
    optimizer = torch.optim.SGD(model.parameters(), lr=0.001, momentum=0.9)
    generator = torch.Generator().manual_seed(dist.get_rank())
    x = torch.randn(BATCH, inputs, generator=generator).to(device)
    y = torch.randn(BATCH, outputs, generator=generator).to(device)
    held = {}

    def step(between=lambda: None):
        for k, (xb, yb) in enumerate(zip(x.chunk(micro), y.chunk(micro), strict=True)):
            last = k == micro - 1
            context = nullcontext()
            if wrapper == "DDP" and not last:
                context = model.no_sync()
            elif wrapper == "FSDP2" and accumulate in ("no_sync", "keep"):
                model.set_requires_gradient_sync(last)
                if accumulate == "keep":
                    model.set_reshard_after_backward(last)
            with context:
                (torch.nn.functional.mse_loss(model(xb), yb) / micro).backward()
            between()
        optimizer.step()
        params = [p for group in optimizer.param_groups for p in group["params"]]
        held["params"] = sum(stored(p) for p in params)
        held["grads"] = sum(stored(p.grad) for p in params if p.grad is not None)
        held["state"] = sum(
            stored(v) for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)
        )
        optimizer.zero_grad(set_to_none=True)

    for _ in range(2):  # warm up: the momentum made, DDP's buckets rebuilt in the order of use
        step()
    tracker = MemTracker() if wrapper == "DDP" else FSDPMemTracker(model, optimizer)
    if wrapper == "DDP":
        tracker.track_external(model, optimizer)
    sent = Sent(dist.get_world_size())
    with tracker, sent:
        step(between=tracker.reset_mod_stats)  # its module-wise records are of one call; its peak, of all
    peak = tracker.get_tracker_snapshot("peak")[device]["Total"]
    allocated = None
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        allocated = torch.cuda.max_memory_allocated()
    times = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        step()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(1000 * (time.perf_counter() - start))
    line = {"model": model_name, "case": label, "rank": dist.get_rank(), "held": sum(held.values())}
    line |= {"peak": peak, "cuda_peak": allocated, "sent": round(sent.bytes), "calls": sent.calls}
    return line | {"step_ms": statistics.median(times)}


# The benchmark: torchrun jobs, rounds, the table --------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nprocs", default="2,4", help="process counts (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds of every case (default: 3)")
    parser.add_argument("--steps", type=int, default=5, help="steps timed a case (default: 5)")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto", help="(default: auto)")
    parser.add_argument(
        "--run_timeout", type=float, default=600, help="seconds a job may take (default: 600)"
    )
    parser.add_argument(
        "--keep", metavar="FILE", help="also write what it printed, date, machine and load (JSON)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)  # a process of a job
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    kept = Kept(args.keep and os.path.abspath(args.keep))
    cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    if cuda and not torch.cuda.is_available():
        parser.error("--device cuda: PyTorch sees no CUDA GPU on this machine; use --device cpu")
    nprocs = [int(n) for n in args.nprocs.split(",")]
    if cuda and max(nprocs) > torch.cuda.device_count():
        parser.error(
            f"--nprocs {args.nprocs}: this machine has {torch.cuda.device_count()} GPU(s), one per process"
        )
    machine = (
        f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}, nccl"
        if cuda
        else f"{os.cpu_count()}-core {platform.machine()} CPU, gloo"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    measured = {}  # (model, case, N) -> {"ranks": [...], "step_ms": [a median a round]}
    for k in range(args.repeats):
        for n in nprocs[k % len(nprocs) :] + nprocs[: k % len(nprocs)]:  # rotated from round to round
            command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}"]
            command += [
                __file__,
                "--worker",
                "--steps",
                str(args.steps),
                "--device",
                "cuda" if cuda else "cpu",
            ]
            try:
                proc = subprocess.run(
                    command, env=env, capture_output=True, text=True, timeout=args.run_timeout
                )
            except subprocess.TimeoutExpired:
                sys.exit(f"memory: the job at N={n} ran past --run_timeout {args.run_timeout:g} s")
            if proc.returncode:
                sys.exit(f"memory: the job at N={n} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
            lines = [json.loads(line[7:]) for line in proc.stdout.splitlines() if line.startswith("MEMORY ")]
            for model in MODELS:
                for label, *_ in CASES:
                    ranks = sorted(
                        (line for line in lines if (line["model"], line["case"]) == (model, label)),
                        key=lambda line: line["rank"],
                    )
                    if [line["rank"] for line in ranks] != list(range(n)):
                        sys.exit(
                            f"memory: {model}, {label}, N={n}: not every rank reported\n{proc.stderr[-3000:]}"
                        )
                    step_ms = statistics.median(line.pop("step_ms") for line in ranks)
                    peaks = [{key: line.pop(key) for key in PEAKS} for line in ranks]
                    case = measured.setdefault(
                        (model, label, n), {"ranks": ranks, "peaks": [], "step_ms": []}
                    )
                    if [{k: v for k, v in line.items() if k not in PEAKS} for line in case["ranks"]] != ranks:
                        sys.exit(f"memory: {model}, {label}, N={n} held or sent other bytes in round {k + 1}")
                    case["peaks"].append(peaks)
                    case["step_ms"].append(step_ms)
        print(f"round {k + 1}/{args.repeats} done", file=sys.stderr, flush=True)
    for case in measured.values():  # a rank's peak: the most of its rounds (when a buffer is freed may vary)
        for rank, line in enumerate(case["ranks"]):
            for key in PEAKS:
                values = [round_[rank][key] for round_ in case["peaks"]]
                line[key] = None if None in values else max(values)
    cases = [
        {"model": model, "case": label, "nproc": n, **measured[model, label, n]}
        for model in MODELS
        for label, *_ in CASES
        for n in nprocs
    ]
    rounds = f"{args.repeats} rounds; step ms: median (min to max)" if args.repeats > 1 else "1 round"
    label = f"batch {BATCH} a process; {machine}; torch {torch.__version__}"
    kept.say(f"{label}; {rounds}")
    for line in table(cases, cuda):
        kept.say(line)
    kept.save(machine, label=label, models=MODELS, cases=cases)


def mib(size):
    return f"{size / 2**20:.2f}"


def largest(case, key):
    """The most any rank of the case measured (ranks differ where N does not divide a weight's rows)."""
    return max(rank[key] for rank in case["ranks"])


def summary(values):
    text = f"{statistics.median(values):.1f}"
    return text if len(values) == 1 else f"{text} ({min(values):.1f} to {max(values):.1f})"


def reference(cases, case):
    """DDP's case that the case is measured against: at the same N, with as many micro-batches."""
    micro = "micro-batches" in case["case"]
    (ddp,) = [
        c
        for c in cases
        if c["model"] == case["model"]
        and c["nproc"] == case["nproc"]
        and c["case"].startswith("DDP")
        and ("micro-batches" in c["case"]) == micro
    ]
    return ddp


def table(cases, cuda=False):
    """The printed report: a table of MiB and ms a model, then FSDP2's peak against DDP's."""
    lines = []
    for model, what in MODELS.items():
        lines += [
            "",
            f"{model}: {what}; MiB on the rank that holds the most",
            "",
            "| case | N | held | peak | / DDP's peak |"
            + (" GPU peak |" if cuda else "")
            + " MiB sent | step ms |",
            "| --- | --- | --- | --- | --- |" + (" --- |" if cuda else "") + " --- | --- |",
        ]
        for case in (c for c in cases if c["model"] == model):
            ratio = largest(case, "peak") / largest(reference(cases, case), "peak")
            gpu = f" {mib(largest(case, 'cuda_peak'))} |" if cuda else ""
            shown = "" if case["case"].startswith("DDP") else f"{ratio:.2f}x"
            lines.append(
                f"| {case['case']} | {case['nproc']} | {mib(largest(case, 'held'))} | "
                f"{mib(largest(case, 'peak'))} | {shown} |{gpu} {mib(largest(case, 'sent'))} | "
                f"{summary(case['step_ms'])} |"
            )
    lines.append("")
    for model in MODELS:
        twins = [c for c in cases if c["model"] == model and c["case"] == "FSDP2"]
        ratios = [
            f"{largest(c, 'peak') / largest(reference(cases, c), 'peak'):.2f}x at N={c['nproc']}"
            for c in twins
        ]
        lines.append(f"FSDP2's peak against DDP's, {model}: {', '.join(ratios)}")
    return lines


if __name__ == "__main__":
    main()
