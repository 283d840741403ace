# check_ddp: exit 1, FAIL step 6 DDP612
"""A forecasting model trained as time-series research code reads: an experiment class with train() and
test(), a setting string that names the run, and a results folder per setting for the test's outputs.

    torchrun --standalone --nproc_per_node=2 timeseries_results_folder_race.py

Mistake: test() runs on every rank (its all-reduce needs them all), and each rank makes the results
folder of the setting itself, os.makedirs(folder), before rank 0 writes the metrics into it: the second
rank to get there finds the folder made and fails with FileExistsError, while the job is testing.
"""

import json
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def windows(n, seq_len=24, pred_len=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = torch.arange(n + seq_len + pred_len, dtype=torch.float32)
    series = torch.sin(t / 6) + 0.1 * torch.randn(len(t), generator=g)
    x = torch.stack([series[i : i + seq_len] for i in range(n)])
    y = torch.stack([series[i + seq_len : i + seq_len + pred_len] for i in range(n)])
    return TensorDataset(x, y)


class Exp:
    def __init__(self, setting):
        self.setting = setting
        self.rank, self.local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
        self.device = torch.device(f"cuda:{self.local_rank}")
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(24, 64), nn.ReLU(), nn.Linear(64, 8)).to(self.device)
        self.model = DDP(model, device_ids=[self.local_rank])

    def train(self, epochs=3):
        data = windows(1024)
        sampler = DistributedSampler(data)
        loader = DataLoader(data, batch_size=32, sampler=sampler)
        optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-3)
        for epoch in range(epochs):
            sampler.set_epoch(epoch)
            totals = torch.zeros(2, device=self.device)
            for x, y in loader:
                x, y = x.to(self.device), y.to(self.device)
                loss = nn.functional.mse_loss(self.model(x), y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                totals += torch.stack(
                    [loss.detach() * len(x), torch.tensor(float(len(x)), device=self.device)]
                )
            dist.all_reduce(totals)
            if self.rank == 0:
                print(f"epoch {epoch}: train mse {(totals[0] / totals[1]).item():.4f}")

    def test(self):
        data = windows(256, seed=1)
        indices = list(range(self.rank, len(data), dist.get_world_size()))
        loader = DataLoader(torch.utils.data.Subset(data, indices), batch_size=64)
        self.model.eval()
        totals = torch.zeros(2, device=self.device)
        with torch.no_grad():
            for x, y in loader:
                x, y = x.to(self.device), y.to(self.device)
                totals += torch.stack(
                    [
                        nn.functional.mse_loss(self.model.module(x), y, reduction="sum"),
                        torch.tensor(float(y.numel()), device=self.device),
                    ]
                )
        dist.all_reduce(totals)
        folder = os.path.join("results", self.setting)
        os.makedirs(folder)  # check_ddp: here
        if self.rank == 0:
            with open(os.path.join(folder, "metrics.json"), "w") as f:
                json.dump({"mse": (totals[0] / totals[1]).item()}, f)
            print(f"test mse {(totals[0] / totals[1]).item():.4f}")


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    exp = Exp("mlp_sl24_pl8_lr0.001")
    exp.train()
    exp.test()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
