"""A pitfall of FSDP step 4: the optimizer built before fully_shard.

    python pitfalls/fsdp_step4_optimizer_before_fully_shard.py

fully_shard puts a new parameter, a DTensor holding this rank's shard, in place of each of the
model's parameters. An optimizer built before it holds the old tensors, which the model no longer
uses: backward() gives its gradients to the DTensors, the old tensors get none, and the optimizer
skips a parameter without a gradient. In torch 2.13 nothing says so, no error and no warning: the
loss stays where it started, every step, and the weights do not change at all.
The fix: build the optimizer after fully_shard, from the parameters the model holds then.
"""

import gc
import re
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from _launch import TIMEOUT_S, report, results, tell, torchrun
from torch.distributed.fsdp import fully_shard

STEPS = 5


def shard(model):  # FSDP step 4: each Linear, then the root
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    return fully_shard(model)


def worker(mode):  # each process of the job, started by torchrun
    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    rank = dist.get_rank()
    torch.manual_seed(0)  # the same initial weights in every process
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    if mode == "mistake":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)  # the model's tensors before sharding
        shard(model)
    else:
        shard(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)  # the DTensors fully_shard put in place
    held = [p for group in optimizer.param_groups for p in group["params"]]
    start = [p.full_tensor() for p in model.parameters()]  # a collective: every rank gathers
    torch.manual_seed(rank)  # each rank its own batch, the same one every step
    x = torch.randn(16, 4)
    y = torch.cat([x.sum(1, keepdim=True), x[:, :1]], dim=1)
    losses = []
    for _ in range(STEPS):
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        with_grad = sum(p.grad is not None for p in held)  # what optimizer.step() will change
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    end = [p.full_tensor() for p in model.parameters()]
    moved = max((b - a).abs().max().item() for a, b in zip(start, end, strict=True))
    tell(
        rank=rank,
        held=len(held),
        the_models=sum(any(p is q for q in model.parameters()) for p in held),
        with_grad=with_grad,
        losses=losses,
        moved=moved,
    )
    del model, optimizer, held
    gc.collect()  # torch 2.13, gloo: a sharded model alive at exit can abort the process (pytorch#190489)
    dist.destroy_process_group()


def main():
    mistake_job = torchrun(__file__, "mistake")
    mistake = {p["rank"]: p for p in results(mistake_job)}
    fix = {p["rank"]: p for p in results(torchrun(__file__, "fix"))}
    said = re.findall(r"^.*(?:[Ww]arning|Error).*$", mistake_job.stderr, flags=re.M)
    m, f = mistake[0], fix[0]
    report(
        mistake="optimizer = SGD(model.parameters()); then fully_shard(...)  # the tensors before sharding",
        symptom=f"no error, no warning; {m['the_models']} of the optimizer's {m['held']} tensors are the"
        f" model's, and {m['with_grad']} get a gradient;\nafter {STEPS} steps no weight has changed"
        f" (by {m['moved']}), and rank 0's loss stays {m['losses'][0]:.4f} at every step",
        fix="fully_shard(...); then optimizer = SGD(model.parameters())  # the DTensors put in their place",
        result=f"{f['the_models']} of its {f['held']} tensors are the model's; rank 0's loss falls"
        f" {f['losses'][0]:.4f} -> {f['losses'][-1]:.4f}, the weights change by up to {f['moved']:.4f}",
        checks={
            "the mistake's optimizer holds none of the model's parameters": all(
                p["the_models"] == 0 and p["held"] == 4 and p["with_grad"] == 0 for p in mistake.values()
            ),
            "the mistake's weights and losses never changed": all(
                p["moved"] == 0 and len(set(p["losses"])) == 1 for p in mistake.values()
            ),
            "the mistake said nothing": mistake_job.returncode == 0 and said == [],
            "the fix trains": all(
                p["the_models"] == p["with_grad"] == 4 and p["moved"] > 0 and p["losses"][-1] < p["losses"][0]
                for p in fix.values()
            ),
        },
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker(sys.argv[1])
    else:
        main()
