"""A pitfall of DDP step 4: a model with a parameter that forward() never uses, wrapped in DDP.

    python pitfalls/step4_unused_parameter.py

DDP all-reduces each gradient when backward() produces it, and waits for all of them
before the next step. A parameter that forward() does not use gets no gradient, the
wait never ends, and the next forward() raises DDP's error. Two fixes:
find_unused_parameters=True, which costs a walk over the autograd graph after every
forward() to find such parameters; or removing the parameter, which costs nothing.
"""

import gc
import sys

import torch
import torch.distributed as dist
from _launch import error_line, report, results, tell, torchrun
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(torch.nn.Module):
    def __init__(self, with_aux_head=True):
        super().__init__()
        self.body = torch.nn.Linear(4, 8)
        self.head = torch.nn.Linear(8, 1)
        if with_aux_head:
            self.aux_head = torch.nn.Linear(8, 1)  # kept for a later experiment; forward() never uses it

    def forward(self, x):
        return self.head(self.body(x).relu())


def train(model, steps=3):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(8, 4)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()


def worker():  # each process of the job, started by torchrun
    dist.init_process_group("gloo")
    try:
        train(DDP(Net()))  # the mistake
        error = ""
    except RuntimeError as raised:  # on every rank alike, before the step's first collective
        error = str(raised)
    train(DDP(Net(), find_unused_parameters=True))  # fix 1: DDP finds the unused ones, every step
    train(DDP(Net(with_aux_head=False)))  # fix 2: no unused parameter
    tell(rank=dist.get_rank(), error=error)
    gc.collect()  # torch 2.13, gloo: a DDP model alive at exit can abort the process (DDP step 7)
    dist.destroy_process_group()


def main():
    said = sorted(results(torchrun(__file__, "worker")), key=lambda p: p["rank"])
    error = said[0]["error"]  # rank 0's
    unused = error_line(error, r"^Parameter indices which did not receive grad")
    names = [name for name, _ in Net().named_parameters()]
    indices = [int(i) for i in unused.split(":")[-1].split()]
    report(
        mistake="model = DDP(Net())  # Net has self.aux_head, which forward() never uses",
        symptom="the second step's forward() raises (the first two sentences of its message):\n"
        + "RuntimeError: "
        + ". ".join(error.split(". ")[:2])
        + ".\n"
        + f"{unused}  (that is {', '.join(names[i] for i in indices)})",
        fix="DDP(Net(), find_unused_parameters=True): costs a walk over the autograd graph after every"
        " forward();\nor remove the unused parameter: costs nothing",
        result=f"both fixes train, on {len(said)} of 2 ranks",
        checks={
            "the mistake fails with DDP's error": all(
                p["error"].startswith("Expected to have finished reduction in the prior iteration")
                for p in said
            ),
            "it names the aux_head parameters": sorted(names[i] for i in indices)
            == ["aux_head.bias", "aux_head.weight"],
            "both fixes train": len(said) == 2,
        },
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker()
    else:
        main()
