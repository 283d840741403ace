# check_ddp: exit 1, FAIL step 10 DDP1001
"""A small image classifier, as course and blog scripts read: a flat main(), a DistributedSampler, the
loss all-reduced each epoch, and a last test on rank 0 before the end, on the test tensors as they are.

    torchrun --standalone --nproc_per_node=2 vision_final_test_rank0_through_ddp.py

Mistake: the last test runs on rank 0 alone, through the DDP model, without a DataLoader (the whole
test set in one forward). DDP's forward broadcasts the BatchNorm buffers to every rank, a collective
the other rank never joins: it has gone on to destroy its process group and end. On nccl rank 0 waits
for the watchdog; on gloo it fails, "Connection closed by peer". The checkpoint after the test is never
written, and the clean-up never comes.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_set(n, seed):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(4, 32, generator=torch.Generator().manual_seed(99))
    labels = torch.randint(0, 4, (n,), generator=g)
    return centers[labels] + torch.randn(n, 32, generator=g), labels


def main():
    dist.init_process_group(backend="nccl")
    rank, local_rank = dist.get_rank(), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)

    x_train, y_train = make_set(2048, seed=0)
    x_test, y_test = make_set(512, seed=1)
    train_set = TensorDataset(x_train, y_train)
    sampler = DistributedSampler(train_set, shuffle=True)
    loader = DataLoader(train_set, batch_size=64, sampler=sampler)

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, 4)).cuda(local_rank)
    model = DDP(net, device_ids=[local_rank])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    for epoch in range(3):
        sampler.set_epoch(epoch)
        model.train()
        totals = torch.zeros(2).cuda(local_rank)
        for x, y in loader:
            x, y = x.cuda(local_rank), y.cuda(local_rank)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(x), torch.tensor(float(len(x))).cuda(local_rank)])
        dist.all_reduce(totals)
        if rank == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")

    if rank == 0:
        model.eval()
        with torch.no_grad():
            logits = model(x_test.cuda(local_rank))  # check_ddp: here
        accuracy = (logits.argmax(1).cpu() == y_test).float().mean().item()
        print(f"test accuracy {accuracy:.3f}")
        torch.save(model.module.state_dict(), "classifier.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
