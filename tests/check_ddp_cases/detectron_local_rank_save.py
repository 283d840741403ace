# check_ddp: exit 0, warn step 6 DDP616
"""A detection-style training script in the manner of detectron2's tools: `comm.get_local_rank()`,
`comm.is_main_process()`, a periodic checkpointer. GPU only.

    torchrun --standalone --nproc_per_node=2 detectron_local_rank_save.py

Mistake: the checkpointer writes when the *local* rank is 0, which is true once per node: on one
machine it looks right, on two nodes sharing a folder two processes write model_final.pth at once.
The guard is an early return (`if comm.get_local_rank() != 0: return`), not an `if` around the save.
A warning: a risk of several machines that one machine, or node-local disks, never meet.
"""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class comm:  # detectron2.utils.comm, the parts used here
    @staticmethod
    def get_local_rank():
        return int(os.environ.get("LOCAL_RANK", 0))

    @staticmethod
    def is_main_process():
        return dist.get_rank() == 0


class Checkpointer:
    def __init__(self, model, optimizer, save_dir="."):
        self.model, self.optimizer, self.save_dir = model, optimizer, save_dir

    def save(self, name, **extra):
        if comm.get_local_rank() != 0:
            return
        data = {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            **extra,
        }
        torch.save(data, os.path.join(self.save_dir, f"{name}.pth"))  # check_ddp: here


def build_model():
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 5))


def main(max_iter_epochs=3):
    local_rank = comm.get_local_rank()
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    device = torch.device(f"cuda:{local_rank}")
    g = torch.Generator().manual_seed(7)
    x = torch.randn(640, 16, generator=g)
    data = TensorDataset(x, x[:, :5].argmax(1))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(7)
    model = build_model().to(device)
    ddp = DistributedDataParallel(model, device_ids=[local_rank], broadcast_buffers=False)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.02, momentum=0.9)
    checkpointer = Checkpointer(model, optimizer)
    for epoch in range(max_iter_epochs):
        sampler.set_epoch(epoch)
        losses = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses += torch.stack([loss.detach() * len(x), torch.tensor(float(len(x)), device=device)])
        dist.all_reduce(losses)
        if comm.is_main_process():
            print(f"iter epoch {epoch}: loss {(losses[0] / losses[1]).item():.4f}")
    checkpointer.save("model_final", iteration=max_iter_epochs * len(loader))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
