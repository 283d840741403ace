# check_ddp: exit 1, FAIL step 6 DDP000
"""A class-based Trainer that snapshots every epoch and resumes from its snapshot, in the style of
pytorch/examples' ddp-tutorial-series: rank 0 saves snapshot.pt, every rank loads it back (here a
second Trainer, as a restarted job makes, in the same run), and the ranks agree on where to start
by a broadcast of rank 0's epoch.

    torchrun --standalone --nproc_per_node=2 trainer_resume_broadcast_no_src.py

Mistake: the broadcast names no source rank, dist.broadcast(start), which torch refuses on every
rank (ValueError: Must specify global_rank or group_rank): the resume crashes. The call is a
collective, but made to resume: a step 6 finding, not a metric's (step 5).
"""

import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Trainer:
    def __init__(self, loader, local_rank, snapshot="snapshot.pt"):
        self.local_rank, self.loader, self.snapshot = local_rank, loader, snapshot
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(20, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.epochs_run = 0
        if os.path.exists(snapshot):
            self._load_snapshot(model)
        self.model = DDP(model.to(f"cuda:{local_rank}"), device_ids=[local_rank])
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-2)

    def _load_snapshot(self, model):
        state = torch.load(self.snapshot, map_location="cpu")
        model.load_state_dict(state["MODEL_STATE"])
        start = torch.tensor([state["EPOCHS_RUN"]], device=f"cuda:{self.local_rank}")
        dist.broadcast(start)  # check_ddp: here
        self.epochs_run = int(start.item())

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self.loader.sampler.set_epoch(epoch)
            for x, y in self.loader:
                x, y = x.to(f"cuda:{self.local_rank}"), y.to(f"cuda:{self.local_rank}")
                self.optimizer.zero_grad()
                F.mse_loss(self.model(x), y).backward()
                self.optimizer.step()
            if dist.get_rank() == 0:
                state = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch + 1}
                torch.save(state, self.snapshot)
            dist.barrier()  # the snapshot is whole before any rank reads it


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 20, generator=g)
    data = TensorDataset(x, x.sum(1, keepdim=True))
    loader = DataLoader(data, batch_size=32, sampler=DistributedSampler(data, seed=1))
    Trainer(loader, local_rank).train(1)
    Trainer(loader, local_rank).train(2)  # as a restarted job: it resumes from the snapshot
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
