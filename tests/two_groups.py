"""train_fsdp.py's own checkpoint code on an optimizer of two parameter groups whose weights all have
one shape, where a parameter's place in the optimizer is not its place in the model.

    torchrun --standalone --nproc_per_node=2 tests/two_groups.py FOLDER

The model: three 4 x 4 layers without bias, a, b, c; the optimizer (SGD with momentum): a and c in
one group, b in another (weight decay on some, say). optimizer.state_dict() numbers them a 0, c 1,
b 2; the model names them a, b, c. A state put back by the model's order gives c's momentum to b,
with no error: the shapes are equal. Here one process trains the plain model (the baseline and the
DDP twin's way) and saves what they save; then the job, sharded as train_fsdp.py shards, loads it
with train_fsdp.py's own load_checkpoint, saves it with its save_checkpoint (a sharded checkpoint,
and the whole file), and loads each of those back into a fresh model. After each load, every rank
gathers each weight's momentum and compares it with the plain optimizer's for that weight, by name.
Rank 0 prints `LOADED <what> <max difference>` for each load; a wrong weight's momentum differs by
far more than rounding.
"""

import argparse
import gc
import runpy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

folder = Path(sys.argv[1])
script = runpy.run_path(str(Path(__file__).parent.parent / "train_fsdp.py"), run_name="train_fsdp")


class Three(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (torch.nn.Linear(4, 4, bias=False) for _ in range(3))

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


def optimizer_of(model):
    groups = [{"params": [model.a.weight, model.c.weight], "weight_decay": 0.1}, {"params": [model.b.weight]}]
    return torch.optim.SGD(groups, lr=0.1, momentum=0.9)


def momenta(model, optimizer):
    """{name: the whole momentum buffer} of each weight (a collective: every rank gathers)."""
    out = {}
    for name, param in model.named_parameters():
        buffer = optimizer.state[param]["momentum_buffer"]
        out[name] = buffer.full_tensor() if hasattr(buffer, "full_tensor") else buffer
    return out


def sharded():
    """A fresh Three, built on the meta device and sharded as train_fsdp.py shards its model."""
    with torch.device("meta"):
        model = Three()
    for block in (model.a, model.b, model.c):
        block.to_empty(device="cpu").reset_parameters()
        fully_shard(block)
    fully_shard(model)
    return model, optimizer_of(model)


dist.init_process_group("gloo")
torch.manual_seed(0)
plain = Three()
plain_optimizer = optimizer_of(plain)
for _ in range(3):  # every rank alike: the plain model, as the baseline trains it
    plain(torch.randn(8, 4, generator=torch.Generator().manual_seed(_))).pow(2).mean().backward()
    plain_optimizer.step()
    plain_optimizer.zero_grad()
expected = momenta(plain, plain_optimizer)
assert len({tuple(buffer.tolist()[0]) for buffer in expected.values()}) == 3  # three different buffers
args = argparse.Namespace(hidden_size=4, epochs=1, save_interval=1, out_dir=str(folder))
if dist.get_rank() == 0:  # the baseline's and the DDP twin's checkpoint: the optimizer's state numbered
    checkpoint = {"epoch": 1, "config": vars(args), "model_state_dict": plain.state_dict()}
    torch.save({**checkpoint, "optimizer_state_dict": plain_optimizer.state_dict()}, folder / "numbered.pt")
dist.barrier()


def load(path, what):
    model, optimizer = sharded()
    script["load_checkpoint"](str(path), args, model, optimizer, torch.device("cpu"))
    loaded = momenta(model, optimizer)
    gap = max((loaded[name] - expected[name]).abs().max().item() for name in expected)
    if dist.get_rank() == 0:
        print(f"LOADED {what} {gap:.3g}", flush=True)
    return model, optimizer


model, optimizer = load(folder / "numbered.pt", "numbered")
script["save_checkpoint"](args, model, optimizer, 1)  # epoch 1 of 1: the folder model_epoch_1, and the file
load(folder / "model_epoch_1", "sharded")
load(folder / "model_epoch_1.pt", "whole")
del model, optimizer
gc.collect()  # torch 2.13, gloo: a sharded model alive at exit can abort the process (pytorch#190489)
dist.destroy_process_group()
