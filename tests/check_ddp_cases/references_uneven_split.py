# check_ddp: exit 1, FAIL step 3 DDP307
"""Classification on synthetic data in the style of torchvision's references/classification (and DETR,
DeiT, MAE that copy it): init_distributed_mode(args), a print silenced off the main process,
MetricLogger meters synchronized between processes, save_on_master, model_without_ddp.

    torchrun --standalone --nproc_per_node=2 references_uneven_split.py --output-dir .

Mistake: each rank takes its own slice of the training set by hand, dataset[rank::world_size], and
2049 samples do not split evenly: rank 0 runs 33 batches, rank 1 32, so rank 0 waits in the all-reduce of
a 33rd backward() while rank 1 waits in the barrier that opens the epoch's metric sync: the job hangs.
"""

import argparse
import builtins
import datetime
import os
import time
from collections import defaultdict, deque

import torch
import torch.distributed as dist
import torch.utils.data
from torch import nn


# ---- utils.py -------------------------------------------------------------------------------------------
def setup_for_distributed(is_master):
    """This function disables printing when not in master process."""
    builtin_print = builtins.print

    def print(*args, **kwargs):
        force = kwargs.pop("force", False)
        if is_master or force:
            builtin_print(*args, **kwargs)

    builtins.print = print


def is_dist_avail_and_initialized():
    return dist.is_available() and dist.is_initialized()


def get_rank():
    return dist.get_rank() if is_dist_avail_and_initialized() else 0


def is_main_process():
    return get_rank() == 0


def save_on_master(*args, **kwargs):
    if is_main_process():
        torch.save(*args, **kwargs)


def init_distributed_mode(args):
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        args.rank = int(os.environ["RANK"])
        args.world_size = int(os.environ["WORLD_SIZE"])
        args.gpu = int(os.environ["LOCAL_RANK"])
    else:
        print("Not using distributed mode")
        args.distributed = False
        return

    args.distributed = True

    torch.cuda.set_device(args.gpu)
    args.dist_backend = "nccl"
    print(f"| distributed init (rank {args.rank}): {args.dist_url}", flush=True)
    dist.init_process_group(
        backend=args.dist_backend, init_method=args.dist_url, world_size=args.world_size, rank=args.rank
    )
    dist.barrier()
    setup_for_distributed(args.rank == 0)


class SmoothedValue:
    """Track a series of values and provide access to smoothed values over a window or the global average."""

    def __init__(self, window_size=20):
        self.deque = deque(maxlen=window_size)
        self.total = 0.0
        self.count = 0

    def update(self, value, n=1):
        self.deque.append(value)
        self.count += n
        self.total += value * n

    def synchronize_between_processes(self):
        """Warning: does not synchronize the deque!"""
        if not is_dist_avail_and_initialized():
            return
        t = torch.tensor([self.count, self.total], dtype=torch.float64, device="cuda")
        dist.barrier()
        dist.all_reduce(t)
        t = t.tolist()
        self.count = int(t[0])
        self.total = t[1]

    @property
    def global_avg(self):
        return self.total / self.count


class MetricLogger:
    def __init__(self, delimiter="  "):
        self.meters = defaultdict(SmoothedValue)
        self.delimiter = delimiter

    def update(self, n=1, **kwargs):
        for k, v in kwargs.items():
            self.meters[k].update(v.item() if isinstance(v, torch.Tensor) else v, n=n)

    def synchronize_between_processes(self):
        for meter in self.meters.values():
            meter.synchronize_between_processes()

    def __str__(self):
        return self.delimiter.join(f"{name}: {meter.global_avg:.4f}" for name, meter in self.meters.items())


# ---- train.py -------------------------------------------------------------------------------------------
def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    y = (x[:, :4].sum(dim=1) > 0).long() + 2 * (x[:, 4:8].sum(dim=1) > 0).long()
    return torch.utils.data.TensorDataset(x, y)


def train_one_epoch(model, criterion, optimizer, data_loader, device, epoch):
    model.train()
    metric_logger = MetricLogger()
    for image, target in data_loader:
        image, target = image.to(device), target.to(device)
        output = model(image)
        loss = criterion(output, target)
        optimizer.zero_grad()
        loss.backward()  # check_ddp: here
        optimizer.step()
        metric_logger.update(loss=loss.item(), n=image.shape[0])
    metric_logger.synchronize_between_processes()
    print(f"Epoch: [{epoch}]  {metric_logger}")


def evaluate(model, criterion, data_loader, device):
    model.eval()
    metric_logger = MetricLogger()
    with torch.inference_mode():
        for image, target in data_loader:
            image, target = image.to(device), target.to(device)
            output = model(image)
            loss = criterion(output, target)
            acc1 = (output.argmax(dim=1) == target).float().mean() * 100
            batch_size = image.shape[0]
            metric_logger.update(loss=loss.item(), n=batch_size)
            metric_logger.meters["acc1"].update(acc1.item(), n=batch_size)
    metric_logger.synchronize_between_processes()
    num_processed_samples = metric_logger.meters["acc1"].count
    if num_processed_samples != len(data_loader.dataset):
        print(
            f"The dataset has {len(data_loader.dataset)} samples, but {num_processed_samples} were evaluated"
        )
    acc1, loss = metric_logger.meters["acc1"].global_avg, metric_logger.meters["loss"].global_avg
    print(f"Test:  Acc@1 {acc1:.3f}  loss {loss:.4f}")
    return metric_logger.meters["acc1"].global_avg


def main(args):
    init_distributed_mode(args)
    print(args)
    device = torch.device(args.device)

    dataset, dataset_test = make_dataset(2049, seed=0), make_dataset(500, seed=1)
    if args.distributed:
        dataset = torch.utils.data.Subset(dataset, range(args.rank, len(dataset), args.world_size))
        train_sampler = torch.utils.data.RandomSampler(dataset)
        test_sampler = torch.utils.data.distributed.DistributedSampler(dataset_test, shuffle=False)
    else:
        train_sampler = torch.utils.data.RandomSampler(dataset)
        test_sampler = torch.utils.data.SequentialSampler(dataset_test)
    data_loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch_size, sampler=train_sampler)
    data_loader_test = torch.utils.data.DataLoader(dataset_test, batch_size=100, sampler=test_sampler)

    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 4)).to(device)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.1)

    model_without_ddp = model
    if args.distributed:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.gpu])
        model_without_ddp = model.module

    print("Start training")
    start_time = time.time()
    for epoch in range(args.epochs):
        train_one_epoch(model, criterion, optimizer, data_loader, device, epoch)
        lr_scheduler.step()
        evaluate(model, criterion, data_loader_test, device)
        if args.output_dir:
            checkpoint = {
                "model": model_without_ddp.state_dict(),
                "optimizer": optimizer.state_dict(),
                "lr_scheduler": lr_scheduler.state_dict(),
                "epoch": epoch,
                "args": vars(args),
            }
            save_on_master(checkpoint, os.path.join(args.output_dir, "checkpoint.pth"))

    total_time = time.time() - start_time
    print(f"Training time {datetime.timedelta(seconds=int(total_time))}")
    if args.distributed:
        dist.destroy_process_group()


def get_args_parser():
    parser = argparse.ArgumentParser(description="PyTorch Classification Training", add_help=True)
    parser.add_argument("--device", default="cuda", type=str, help="device (Use cuda or cpu Default: cuda)")
    parser.add_argument("-b", "--batch-size", default=32, type=int, help="images per gpu (default: 32)")
    parser.add_argument("--epochs", default=3, type=int, help="number of total epochs to run (default: 3)")
    parser.add_argument("--lr", default=0.1, type=float, help="initial learning rate (default: 0.1)")
    parser.add_argument("--output-dir", default=".", type=str, help="path to save outputs (default: .)")
    parser.add_argument(
        "--dist-url", default="env://", type=str, help="url used to set up distributed training"
    )
    return parser


if __name__ == "__main__":
    main(get_args_parser().parse_args())
