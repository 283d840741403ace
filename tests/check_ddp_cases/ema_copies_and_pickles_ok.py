# check_ddp: exit 0
"""A script that copies and pickles its model and tensors, as EMA trainers and checkpoint code do:
deepcopy of the model after it is on its device and before the wrap, pickle.dumps of the bare model,
torch.save of a tensor, vars() of the model. CPU-aware: a GPU where there is one.

    torchrun --standalone --nproc_per_node=2 ema_copies_and_pickles_ok.py

Correct. It also checks, from the inside, that nothing it holds was changed by whoever watches it: no
attribute, no hook, no extra field in what it saves (it fails if there is one).
"""

import io
import os
import pickle
from copy import deepcopy

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def untouched(model, what):
    extra = [k for k in vars(model) if k.startswith("_check")] + [
        h for h in model._forward_pre_hooks.values() if "check_ddp" in getattr(h, "__module__", "") + repr(h)
    ]
    assert not extra, f"{what} carries what it was not given: {extra}"


def main():
    use_cuda = torch.cuda.is_available()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)).to(device)
    ema = deepcopy(model)
    untouched(ema, "the deepcopy of the model")
    untouched(pickle.loads(pickle.dumps(model)), "the model, pickled")
    buffer = io.BytesIO()
    torch.save({"weight": model[0].weight.detach(), "bias": model[0].bias}, buffer)
    buffer.seek(0)
    saved = torch.load(buffer)
    assert not vars(saved["bias"]), f"a saved tensor carries {vars(saved['bias'])}"
    model = DDP(model, device_ids=[local_rank] if use_cuda else None)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 4, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    sampler = DistributedSampler(data, seed=0)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        total = torch.zeros(2, device=device)
        for xb, yb in DataLoader(data, batch_size=32, sampler=sampler):
            loss = nn.functional.mse_loss(model(xb.to(device)), yb.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for e, p in zip(ema.parameters(), model.module.parameters(), strict=True):
                    e.mul_(0.9).add_(p, alpha=0.1)
            total += torch.stack([loss.detach() * len(xb), loss.new_tensor(len(xb))])
        dist.all_reduce(total)
        untouched(deepcopy(model.module), "a copy of the wrapped model")
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {(total[0] / total[1]).item():.4f}")
            torch.save(
                {
                    "model": model.module.state_dict(),
                    "ema": ema.state_dict(),
                    "optimizer": optimizer.state_dict(),
                },
                "ema.pt",
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
