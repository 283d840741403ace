# check_ddp: exit 1, FAIL step 6 DDP000, FAIL step 8 DDP801
"""pytorch/examples imagenet/main.py's shape: main() starts one process per GPU with mp.spawn, and
main_worker(gpu, ngpus_per_node, args) trains, saves checkpoint.pth.tar each epoch, and fine-tunes from
the best one at the end. GPU only.

    python imagenet_resume_crash.py        # as its authors run it: it starts its own processes

Mistakes: run under torchrun, it starts a job of its own in every process. And in the child, the
checkpoint saved from the DDP wrapper (every key starts with module.) is loaded back into a bare model
for the fine-tuning: the resume crashes with missing and unexpected keys.
"""

import argparse
import shutil

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def make_model():
    return nn.Sequential(nn.Flatten(), nn.Linear(48, 32), nn.ReLU(), nn.Linear(32, 10))


def save_checkpoint(state, is_best, filename="checkpoint.pth.tar"):
    torch.save(state, filename)
    if is_best:
        shutil.copyfile(filename, "model_best.pth.tar")


def train_epochs(model, loader, sampler, optimizer, gpu, epochs, start=0):
    for epoch in range(start, start + epochs):
        sampler.set_epoch(epoch)
        totals = torch.zeros(2).cuda(gpu)
        for images, target in loader:
            images, target = (
                images.cuda(gpu, non_blocking=True),
                target.cuda(gpu, non_blocking=True),
            )
            loss = nn.functional.cross_entropy(model(images), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack(
                [
                    loss.detach() * len(target),
                    torch.tensor(float(len(target))).cuda(gpu),
                ]
            )
        dist.all_reduce(totals)
        yield epoch, (totals[0] / totals[1]).item()


def main_worker(gpu, ngpus_per_node, args):
    dist.init_process_group(backend="nccl")  # where its launcher said, in the environment
    torch.cuda.set_device(gpu)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(
        torch.randn(512, 3, 4, 4, generator=g),
        torch.randint(0, 10, (512,), generator=g),
    )
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=32, sampler=sampler, pin_memory=True)
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(make_model().cuda(gpu), device_ids=[gpu])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    best = float("inf")
    for epoch, loss in train_epochs(model, loader, sampler, optimizer, gpu, args.epochs):
        if dist.get_rank() == 0:
            save_checkpoint(
                {
                    "epoch": epoch + 1,
                    "state_dict": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                },
                loss < best,
            )
        best = min(best, loss)
        dist.barrier()

    # fine-tune from the best checkpoint, with a fresh model and a lower learning rate
    checkpoint = torch.load("model_best.pth.tar", map_location=f"cuda:{gpu}")
    finetuned = make_model()
    finetuned.load_state_dict(checkpoint["state_dict"])  # check_ddp: here
    model = nn.parallel.DistributedDataParallel(finetuned.cuda(gpu), device_ids=[gpu])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in train_epochs(model, loader, sampler, optimizer, gpu, 1, start=checkpoint["epoch"]):
        pass
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description="PyTorch ImageNet Training")
    parser.add_argument("--epochs", default=2, type=int)
    args = parser.parse_args()
    ngpus_per_node = torch.cuda.device_count()
    mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))


if __name__ == "__main__":
    main()
