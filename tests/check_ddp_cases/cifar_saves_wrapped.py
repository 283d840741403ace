# check_ddp: exit 0, warn step 6 DDP603
"""A CIFAR training script from a blog's DDP tutorial: a `train()` and a `test()`, the checkpoint saved by
rank 0 with `torch.save(net.state_dict(), PATH)`, and a commented-out reload. GPU only.

    torchrun --standalone --nproc_per_node=2 cifar_saves_wrapped.py

Not quite right: net is the DDP model, so every key of the checkpoint starts with module.: nothing but a
DDP model loads it (not the network alone, for inference).
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

PATH = "./cifar_net.pth"


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 6, 5)
        self.fc = nn.Linear(6 * 4 * 4, 10)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.max_pool2d(torch.relu(self.conv(x)), 2), 1))


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 3, 12, 12, generator=g), torch.randint(0, 10, (256,), generator=g))
    sampler = DistributedSampler(data)
    trainloader = DataLoader(data, batch_size=32, sampler=sampler)
    torch.manual_seed(0)
    net = nn.parallel.DistributedDataParallel(Net().cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        running = torch.zeros(2).cuda()
        for inputs, labels in trainloader:
            inputs, labels = inputs.cuda(), labels.cuda()
            loss = nn.functional.cross_entropy(net(inputs), labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            running += torch.stack([loss.detach() * len(labels), torch.tensor(float(len(labels))).cuda()])
        dist.all_reduce(running)
        if dist.get_rank() == 0:
            print(f"[{epoch + 1}] loss: {(running[0] / running[1]).item():.3f}")
    if dist.get_rank() == 0:
        torch.save({"net": net.state_dict(), "optimizer": optimizer.state_dict()}, PATH)  # check_ddp: here
    # net.load_state_dict(torch.load(PATH)["net"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
