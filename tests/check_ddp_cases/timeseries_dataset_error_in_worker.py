# check_ddp: exit 1, FAIL script DDP000
"""Next-value forecasting on a synthetic series, with a windowed Dataset of its own, loaded by two
worker processes a rank, sharded by a DistributedSampler with set_epoch.

    torchrun --standalone --nproc_per_node=2 timeseries_dataset_error_in_worker.py

Mistake: an ordinary bug: the Dataset's __len__ counts one window too many (len(series) - window + 1
windows, each of which needs a next value), so that the sampler draws the last index, whose target
lies past the series' end, and __getitem__ raises IndexError in a DataLoader worker; torch raises it
again in the rank's own process ("Caught IndexError in DataLoader worker process 0"). One process of
the single-GPU script, drawing every index, fails the same way: the Dataset's own error, no DDP step's.
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Windows(Dataset):
    def __init__(self, series, window):
        self.series, self.window = series, window

    def __len__(self):
        return len(self.series) - self.window + 1  # one too many: the last window has no next value

    def __getitem__(self, i):
        x = self.series[i : i + self.window]
        y = self.series[i + self.window]  # check_ddp: here
        return x, y.unsqueeze(0)


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)  # the same series on every rank
    series = torch.sin(torch.arange(300) / 10.0) + 0.1 * torch.randn(300)
    data = Windows(series, window=16)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=32, sampler=sampler, num_workers=2)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            optimizer.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
