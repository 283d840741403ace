# check_ddp: exit 0
"""A classifier written in the style of PyTorch's early years, and still correct under torchrun: legacy
tensor types (torch.cuda.FloatTensor, x.type(torch.cuda.LongTensor)), an isinstance check on them, the
GPU's own generator seeded, and memory logged with torch.cuda's older calls (memory_cached).

    torchrun --standalone --nproc_per_node=2 legacy_cuda_types_ok.py

No mistake: every call here is torch.cuda's public API, which the stand-in answers as a whole.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group(backend="nccl", init_method="env://")
    torch.manual_seed(0)
    torch.cuda.default_generators[local_rank].manual_seed(0)

    g = torch.Generator().manual_seed(0)
    features = torch.randn(1024, 12, generator=g)
    labels = (features[:, 0] > 0).long()
    data = TensorDataset(features, labels)
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=64, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(12, 24), nn.ReLU(), nn.Linear(24, 2)).cuda(), device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    criterion = nn.CrossEntropyLoss().cuda()
    for epoch in range(2):
        sampler.set_epoch(epoch)
        totals = torch.cuda.FloatTensor(2).zero_()
        for x, y in loader:
            x = x.type(torch.cuda.FloatTensor)
            y = y.type(torch.cuda.LongTensor)
            assert isinstance(x, torch.cuda.FloatTensor), x.type()
            loss = criterion(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(x), torch.cuda.FloatTensor([len(x)])[0]])
        dist.all_reduce(totals)
        if dist.get_rank() == 0:
            cached = torch.cuda.memory_cached() / 2**20
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}, cached {cached:.0f} MiB")
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, "legacy.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
