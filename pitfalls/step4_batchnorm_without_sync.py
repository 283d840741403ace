"""A pitfall of DDP step 4: BatchNorm under DDP, without SyncBatchNorm.

    python pitfalls/step4_batchnorm_without_sync.py

BatchNorm normalizes with the statistics of the batch it sees: under DDP, each rank's
own batch, not the global one. Each rank keeps its own running statistics, and the ones
rank 0 saves come from its shard alone. SyncBatchNorm.convert_sync_batchnorm(model)
computes the statistics over the ranks' batches together, but torch 2.13's SyncBatchNorm
runs only on GPUs (and XPU, HPU): on a CPU, DDP refuses to wrap it, as shown. So what it
computes is written out below, WrittenOutSyncBatchNorm, with all-reduces that gloo runs
on a CPU; its ranks agree, and match one process that trains on the global batches.
"""

import gc
import sys

import torch
import torch.distributed as dist
import torch.distributed.nn.functional as dist_fn
from _launch import report, results, tell, torchrun
from torch.nn.parallel import DistributedDataParallel as DDP

GLOBAL_BATCH, STEPS = 16, 4


class WrittenOutSyncBatchNorm(torch.nn.BatchNorm1d):
    """What SyncBatchNorm computes in training: the mean and variance of all ranks' batches
    together. Its all-reduce is differentiable (torch.distributed.nn), as SyncBatchNorm's is."""

    def forward(self, x):
        if not self.training:
            return super().forward(x)
        sums = dist_fn.all_reduce(torch.cat([x.sum(0), (x * x).sum(0), x.new_tensor([len(x)])]))
        channels, count = x.shape[1], sums[-1]
        mean = sums[:channels] / count
        var = sums[channels : 2 * channels] / count - mean**2
        with torch.no_grad():  # running statistics, as BatchNorm keeps them (unbiased variance)
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var * count / (count - 1), self.momentum)
            self.num_batches_tracked += 1
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


def build_model(norm=torch.nn.BatchNorm1d):
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), norm(8), torch.nn.ReLU(), torch.nn.Linear(8, 1))


def batches(rank, world_size):
    """This rank's part of each global batch, from data that is the same in every process."""
    gen = torch.Generator().manual_seed(0)
    x = 3 * torch.randn(GLOBAL_BATCH * STEPS, 4, generator=gen) + 1
    y = x.sum(1, keepdim=True)
    for i in range(0, len(x), GLOBAL_BATCH):
        yield x[i : i + GLOBAL_BATCH][rank::world_size], y[i : i + GLOBAL_BATCH][rank::world_size]


def train(model, rank=0, world_size=1):
    """Train STEPS steps; return the BatchNorm's running mean, first 3 channels."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in batches(rank, world_size):
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    bare = model.module if isinstance(model, DDP) else model
    return bare[1].running_mean[:3].tolist()


def worker():  # each process of the job, started by torchrun
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    plain = train(DDP(build_model()), rank, world_size)  # the mistake
    try:  # the fix, on a CPU
        train(DDP(torch.nn.SyncBatchNorm.convert_sync_batchnorm(build_model())), rank, world_size)
        refused = ""
    except ValueError as error:
        refused = f"ValueError: {error}"
    written_out = train(DDP(build_model(WrittenOutSyncBatchNorm)), rank, world_size)
    one_process = train(build_model())  # one process, the global batches, plain BatchNorm
    tell(rank=rank, plain=plain, refused=refused, written_out=written_out, one_process=one_process)
    gc.collect()  # torch 2.13, gloo: a DDP model alive at exit can abort the process (DDP step 7)
    dist.destroy_process_group()


def main():
    ranks = sorted(results(torchrun(__file__, "worker")), key=lambda p: p["rank"])

    def close(a, b):
        return max(abs(u - v) for u, v in zip(a, b, strict=True)) < 1e-5

    def show(values):
        return "[" + ", ".join(f"{v:.4f}" for v in values) + "]"

    plain, written_out = [p["plain"] for p in ranks], [p["written_out"] for p in ranks]
    one_process, refused = ranks[0]["one_process"], ranks[0]["refused"]
    report(
        mistake="model = DDP(model)  # with torch.nn.BatchNorm1d inside",
        symptom=f"running_mean[:3] after {STEPS} steps: rank 0 {show(plain[0])}, rank 1 {show(plain[1])}\n"
        f"(one process on the global batches: {show(one_process)})",
        fix=f"model = DDP(torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)); on this CPU:\n{refused}",
        result=f"written out for the CPU: rank 0 {show(written_out[0])}, rank 1 {show(written_out[1])}:"
        " the one process's",
        checks={
            "plain BatchNorm's ranks differ": not close(plain[0], plain[1]),
            "and differ from one process": not close(plain[0], one_process),
            "SyncBatchNorm refuses the CPU": refused.startswith("ValueError: SyncBatchNorm"),
            "written out, the ranks agree with one process": all(close(w, one_process) for w in written_out),
        },
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker()
    else:
        main()
