# check_ddp: exit 0
"""A BERT-fine-tuning-style script from the apex era, moved to torchrun: `args.local_rank` from the
environment, `torch.cuda.set_device(args.local_rank)`, `model.cuda(args.local_rank)`,
`.cuda(non_blocking=True)` on every batch, a linear warm-up schedule, `is_main_process()` for logging
and saving. GPU only.

    torchrun --standalone --nproc_per_node=2 apex_model_cuda_ok.py --num_train_epochs 3
"""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, RandomSampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def is_main_process():
    return dist.get_rank() == 0


class Classifier(nn.Module):
    def __init__(self, vocab=100, dim=32, labels=3):
        super().__init__()
        self.embeddings = nn.EmbeddingBag(vocab, dim)
        self.classifier = nn.Linear(dim, labels)

    def forward(self, input_ids, labels=None):
        logits = self.classifier(self.embeddings(input_ids))
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return loss, logits


def load_examples(seed=1234):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 100, (768, 12), generator=g)
    labels = ids[:, 0] % 3
    return TensorDataset(ids, labels)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--num_train_epochs", type=int, default=3)
    parser.add_argument("--train_batch_size", type=int, default=16)
    parser.add_argument("--learning_rate", type=float, default=5e-3)
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)))
    args = parser.parse_args()

    torch.cuda.set_device(args.local_rank)
    dist.init_process_group(backend="nccl")
    train_data = load_examples()
    train_sampler = DistributedSampler(train_data) if args.local_rank != -1 else RandomSampler(train_data)
    train_dataloader = DataLoader(train_data, sampler=train_sampler, batch_size=args.train_batch_size)

    torch.manual_seed(1234)
    model = Classifier()
    model.cuda(args.local_rank)
    model = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[args.local_rank], output_device=args.local_rank
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    total = args.num_train_epochs * len(train_dataloader)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / (0.1 * total))
    )

    for epoch in range(args.num_train_epochs):
        train_sampler.set_epoch(epoch)
        tr_loss = torch.zeros(2).cuda(args.local_rank)
        for input_ids, labels in train_dataloader:
            input_ids, labels = (
                input_ids.cuda(non_blocking=True),
                labels.cuda(non_blocking=True),
            )
            loss, _ = model(input_ids, labels=labels)
            loss.backward()
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()
            tr_loss += torch.stack([loss.detach() * len(labels), torch.tensor(float(len(labels))).cuda()])
        dist.all_reduce(tr_loss)
        if is_main_process():
            print(f"epoch {epoch}: train loss {(tr_loss[0] / tr_loss[1]).item():.4f}")

    if is_main_process():
        model_to_save = model.module if hasattr(model, "module") else model
        torch.save(
            {"model": model_to_save.state_dict(), "optimizer": optimizer.state_dict()},
            "pytorch_model.bin",
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
