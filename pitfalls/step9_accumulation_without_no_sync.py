"""A pitfall of DDP step 9: gradient accumulation without model.no_sync().

    python pitfalls/step9_accumulation_without_no_sync.py

With K micro-batches per optimizer step, DDP all-reduces the gradients in every
backward(): K times per step, where once would do. The weights come out the same; the
communication is K times as much. Inside model.no_sync(), backward() keeps the
gradients local, and the last micro-batch's backward() all-reduces their sum once.
The all-reduces are counted with a DDP communication hook that does what DDP does.
"""

import contextlib
import gc
import sys

import torch
import torch.distributed as dist
from _launch import report, results, tell, torchrun
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel as DDP

K, STEPS = 4, 2  # micro-batches per optimizer step, optimizer steps


def train(use_no_sync):
    """Train STEPS steps of K micro-batches; return the weights and how many all-reduces DDP made."""
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
    calls = 0

    def counting_hook(process_group, bucket):  # DDP hands each bucket of gradients to its hook
        nonlocal calls
        calls += 1
        return allreduce_hook(process_group, bucket)  # the all-reduce DDP does by default

    model.register_comm_hook(None, counting_hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(dist.get_rank())  # this rank's data
    for _ in range(STEPS):
        for micro in range(K):
            last = micro == K - 1
            with model.no_sync() if use_no_sync and not last else contextlib.nullcontext():
                x = torch.randn(8, 8, generator=gen)
                (model(x).pow(2).mean() / K).backward()
        optimizer.step()
        optimizer.zero_grad()
    return torch.cat([p.detach().flatten() for p in model.parameters()]), calls


def worker():  # each process of the job, started by torchrun
    dist.init_process_group("gloo")
    weights_mistake, calls_mistake = train(use_no_sync=False)
    weights_fix, calls_fix = train(use_no_sync=True)
    difference = (weights_mistake - weights_fix).abs().max().item()
    tell(rank=dist.get_rank(), mistake=calls_mistake, fix=calls_fix, difference=difference)
    gc.collect()  # torch 2.13, gloo: a DDP model alive at exit can abort the process (DDP step 7)
    dist.destroy_process_group()


def main():
    said = results(torchrun(__file__, "worker"))
    mistake, fix = said[0]["mistake"], said[0]["fix"]
    difference = max(p["difference"] for p in said)
    report(
        mistake=f"for each of {K} micro-batches: (loss / {K}).backward()  # no model.no_sync()",
        symptom=f"{mistake} all-reduces for {STEPS} optimizer steps: one per micro-batch",
        fix=f"the first {K - 1} backward() calls of each step inside `with model.no_sync():`",
        result=f"{fix} all-reduces for {STEPS} steps; the weights differ from the mistake's by"
        f" at most {difference:.1e}",
        checks={
            "the mistake all-reduces every micro-batch": mistake == K * STEPS,
            "the fix all-reduces once a step": fix == STEPS,
            "every rank counted the same": all(p["mistake"] == mistake and p["fix"] == fix for p in said),
            "the same weights, to float rounding": difference < 1e-6,
        },
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker()
    else:
        main()
