# check_ddp: exit 1, FAIL step 3 DDP305
"""A sequence model trained in the manner of fairseq's train.py: a Task that builds the dataset and an
epoch iterator, DataLoader workers that prepare the batches (num_workers=2, persistent across epochs),
a Trainer with train_step(). GPU only.

    torchrun --standalone --nproc_per_node=2 fairseq_workers_no_set_epoch.py

Mistake: the epoch iterator is built once and never told the epoch: DistributedSampler shuffles the
same way every epoch. (DataLoader workers do not hide it.)
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler


class TokenDataset(Dataset):
    def __init__(self, n=512, length=8, vocab=50, seed=1):
        g = torch.Generator().manual_seed(seed)
        self.src = torch.randint(1, vocab, (n, length), generator=g)

    def __len__(self):
        return len(self.src)

    def __getitem__(self, i):
        return {"src_tokens": self.src[i], "target": self.src[i].flip(0)}


class TranslationTask:
    def __init__(self):
        self.dataset = TokenDataset()

    def get_batch_iterator(self, batch_size=32):
        sampler = DistributedSampler(self.dataset, shuffle=True, seed=1)
        return DataLoader(  # check_ddp: here
            self.dataset,
            batch_size=batch_size,
            sampler=sampler,
            num_workers=2,
            persistent_workers=True,
        )


class Trainer:
    def __init__(self, model, device):
        self.device = device
        self.model = DistributedDataParallel(model.to(device), device_ids=[device.index])
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=5e-3)

    def train_step(self, sample):
        src, tgt = (
            sample["src_tokens"].to(self.device),
            sample["target"].to(self.device),
        )
        logits = self.model(src)
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), tgt.flatten(), reduction="sum")
        self.optimizer.zero_grad()
        (loss / tgt.numel()).backward()
        self.optimizer.step()
        return torch.stack([loss.detach(), torch.tensor(float(tgt.numel()), device=self.device)])


def main(max_epoch=3):
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
    task = TranslationTask()
    torch.manual_seed(1)
    model = nn.Sequential(nn.Embedding(50, 32), nn.Linear(32, 50))
    trainer = Trainer(model, device)
    epoch_itr = task.get_batch_iterator()
    for epoch in range(1, max_epoch + 1):
        stats = torch.zeros(2, device=device)
        for sample in epoch_itr:
            stats += trainer.train_step(sample)
        dist.all_reduce(stats)
        if dist.get_rank() == 0:
            print(f"epoch {epoch:03d} | loss {(stats[0] / stats[1]).item():.3f}")
            torch.save(
                {
                    "model": trainer.model.module.state_dict(),
                    "optimizer": trainer.optimizer.state_dict(),
                },
                "checkpoint_last.pt",
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
