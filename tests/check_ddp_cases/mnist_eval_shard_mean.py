# check_ddp: exit 0, warn step 10 DDP1003
"""Digit classification on synthetic 12x12 images, in the style of pytorch/examples mnist/main.py,
converted to DDP: a plain main(), an argparse whose help states the defaults, a flat loop.

    torchrun --standalone --nproc_per_node=2 mnist_eval_not_reduced.py
    torchrun --standalone --nproc_per_node=2 mnist_eval_not_reduced.py --epochs 2 --no-save-model

Mistake: test() divides by the rank's own share of the test set (len(test_loader.sampler)), as a
first fix of the single-process one, and never all-reduces: each rank's loss and accuracy are right
for its shard, and rank 0 reports its shard's as the whole set's (an estimate, from half the set).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, 1)
        self.conv2 = nn.Conv2d(8, 16, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(16 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = self.conv1(x)
        x = F.relu(x)
        x = self.conv2(x)
        x = F.relu(x)
        x = F.max_pool2d(x, 2)
        x = self.dropout1(x)
        x = torch.flatten(x, 1)
        x = self.fc1(x)
        x = F.relu(x)
        x = self.dropout2(x)
        x = self.fc2(x)
        output = F.log_softmax(x, dim=1)
        return output


def synthetic_digits(n, seed):
    """n noisy copies of 10 fixed 12x12 patterns, one per class."""
    g = torch.Generator().manual_seed(seed)
    patterns = torch.randn(10, 1, 12, 12, generator=torch.Generator().manual_seed(1234))
    targets = torch.randint(0, 10, (n,), generator=g)
    images = patterns[targets] + 0.8 * torch.randn(n, 1, 12, 12, generator=g)
    return TensorDataset(images, targets)


def train(args, model, device, train_loader, optimizer, epoch):
    model.train()
    total_loss = torch.zeros(2, device=device)
    for data, target in train_loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target)
        loss.backward()
        optimizer.step()
        total_loss[0] += loss.detach() * len(data)
        total_loss[1] += len(data)
        if args.dry_run:
            break
    dist.all_reduce(total_loss, op=dist.ReduceOp.SUM)
    if dist.get_rank() == 0:
        print(f"Train Epoch: {epoch}\tLoss: {total_loss[0].item() / total_loss[1].item():.6f}")


def test(model, device, test_loader):
    model.eval()
    test_loss = 0
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            data, target = data.to(device), target.to(device)
            output = model(data)
            test_loss += F.nll_loss(output, target, reduction="sum").item()  # sum up batch loss
            pred = output.argmax(dim=1, keepdim=True)  # get the index of the max log-probability
            correct += pred.eq(target.view_as(pred)).sum().item()

    test_loss /= len(test_loader.sampler)

    if dist.get_rank() == 0:
        n = len(test_loader.sampler)
        print(
            f"\nTest set: Average loss: {test_loss:.4f}, Accuracy: {correct}/{n} ({100.0 * correct / n:.0f}%)"
        )


def main():
    # Training settings
    parser = argparse.ArgumentParser(description="PyTorch synthetic-digits DDP example")
    parser.add_argument(
        "--batch-size", type=int, default=64, metavar="N", help="input batch size per process (default: 64)"
    )
    parser.add_argument(
        "--test-batch-size",
        type=int,
        default=200,
        metavar="N",
        help="input batch size for testing (default: 200)",
    )
    parser.add_argument(
        "--epochs", type=int, default=3, metavar="N", help="number of epochs to train (default: 3)"
    )
    parser.add_argument("--lr", type=float, default=1.0, metavar="LR", help="learning rate (default: 1.0)")
    parser.add_argument(
        "--gamma", type=float, default=0.7, metavar="M", help="learning rate step gamma (default: 0.7)"
    )
    parser.add_argument("--dry-run", action="store_true", help="quickly check a single pass")
    parser.add_argument("--seed", type=int, default=1, metavar="S", help="random seed (default: 1)")
    parser.add_argument(
        "--save-model",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="save the model and optimizer to mnist_cnn.pt (default: on)",
    )
    args = parser.parse_args()

    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend=backend)
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")

    torch.manual_seed(args.seed)

    dataset1 = synthetic_digits(1024, seed=args.seed)
    dataset2 = synthetic_digits(400, seed=args.seed + 1)
    train_sampler = DistributedSampler(dataset1, shuffle=True, seed=args.seed)
    test_sampler = DistributedSampler(dataset2, shuffle=False)
    train_loader = DataLoader(dataset1, batch_size=args.batch_size, sampler=train_sampler)
    test_loader = DataLoader(dataset2, batch_size=args.test_batch_size, sampler=test_sampler)

    model = Net().to(device)
    model = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    optimizer = optim.Adadelta(model.parameters(), lr=args.lr)

    scheduler = StepLR(optimizer, step_size=1, gamma=args.gamma)
    for epoch in range(1, args.epochs + 1):
        train_sampler.set_epoch(epoch)
        train(args, model, device, train_loader, optimizer, epoch)
        test(model, device, test_loader)
        scheduler.step()

    if args.save_model and dist.get_rank() == 0:
        torch.save(
            {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "epoch": args.epochs},
            "mnist_cnn.pt",
        )

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
