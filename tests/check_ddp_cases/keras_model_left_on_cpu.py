# check_ddp: exit 1, FAIL step 2 DDP204
"""A tabular regression script written by someone coming from Keras: a fit() function with callbacks
printed as a progress line, a History dict, the model built by a build_model() function. GPU only.

    torchrun --standalone --nproc_per_node=2 keras_model_left_on_cpu.py

Mistake: the batches go to the GPU, the model never does: it is wrapped in DDP on the CPU, with nccl
as the backend. On GPUs DDP's first broadcast of the weights fails.
"""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def build_model(n_features):
    return nn.Sequential(nn.Linear(n_features, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))


def fit(model, loader, sampler, device, epochs):
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    history = {"loss": []}
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        totals = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(x), torch.tensor(float(len(x)), device=device)])
        dist.all_reduce(totals)
        history["loss"].append((totals[0] / totals[1]).item())
        if dist.get_rank() == 0:
            print(f"Epoch {epoch + 1}/{epochs} - loss: {history['loss'][-1]:.4f}")
    return history, optimizer


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    device = torch.device("cuda", local_rank)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(1024, 10, generator=g)
    y = x @ torch.randn(10, 1, generator=g) + 0.1 * torch.randn(1024, 1, generator=g)
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset)
    loader = DataLoader(dataset, batch_size=64, sampler=sampler)
    torch.manual_seed(3)
    model = DDP(build_model(10))  # check_ddp: here
    history, optimizer = fit(model, loader, sampler, device, epochs=3)
    if dist.get_rank() == 0:
        torch.save(
            {
                "model": model.module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "history": history,
            },
            "model.pt",
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
