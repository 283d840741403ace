# check_ddp: exit 1, FAIL step 2 DDP205
"""An MNIST example ported from Horovod to DDP, with a `--device` option: the model goes to the GPU with
`model.cuda()`, and the train() and test() loops call `model(data)` on the batches as the loader gives
them. GPU only as written with --device gpu (the default here).

    torchrun --standalone --nproc_per_node=2 horovod_batches_on_cpu.py

Mistake: the batches never go to the GPU: on a GPU the first layer gets weights on cuda and input on the
CPU, and fails.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def train(model, loader, sampler, optimizer, epoch):
    model.train()
    sampler.set_epoch(epoch)
    for data, target in loader:
        output = model(data)  # check_ddp: here
        loss = nn.functional.nll_loss(output, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="gpu", choices=["cpu", "gpu"])
    args = parser.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl" if args.device == "gpu" else "gloo")
    g = torch.Generator().manual_seed(42)
    data = TensorDataset(torch.randn(256, 1, 8, 8, generator=g), torch.randint(0, 10, (256,), generator=g))
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 10), nn.LogSoftmax(dim=1))
    if args.device == "gpu":
        torch.cuda.set_device(local_rank)
        model.cuda()
    model = nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        train(model, loader, sampler, optimizer, epoch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
