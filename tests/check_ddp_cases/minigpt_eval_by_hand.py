# check_ddp: exit 0, warn step 5 DDP506, warn step 10 DDP1006
"""A character-level language model in the style of minGPT/nanoGPT notebooks turned into a script: a
get_batch(split) that draws random windows from a tensor of tokens, no DataLoader, and an
estimate_loss() every few iterations, on every rank. GPU only.

    torchrun --standalone --nproc_per_node=2 minigpt_eval_by_hand.py

Not quite right: each rank estimates the validation loss on batches of its own and rank 0 prints its
own estimate: no all-reduce, so the number printed is rank 0's batches' alone.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

block_size, batch_size, eval_iters, max_iters, eval_interval = 16, 8, 4, 24, 8
dist.init_process_group(backend="nccl")
ddp_rank, ddp_local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
device = f"cuda:{ddp_local_rank}"
torch.cuda.set_device(device)
torch.manual_seed(1337 + ddp_rank)  # a different stream of batches on each rank

text = torch.arange(4000) % 37  # the "dataset": the same tokens on every rank
n = int(0.9 * len(text))
train_data, val_data = text[:n], text[n:]


def get_batch(split):
    data = train_data if split == "train" else val_data
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i : i + block_size] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix])
    return x.to(device), y.to(device)


class BigramModel(nn.Module):
    def __init__(self, vocab=37):
        super().__init__()
        self.table = nn.Embedding(vocab, vocab)

    def forward(self, idx, targets):
        logits = self.table(idx)
        return logits, nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ("train", "val"):
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            _, loss = model(X, Y)  # check_ddp: here
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


torch.manual_seed(1337)
model = DDP(BigramModel().to(device), device_ids=[ddp_local_rank])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
torch.manual_seed(1337 + ddp_rank)
for it in range(max_iters):
    if it % eval_interval == 0:
        losses = estimate_loss()
        if ddp_rank == 0:
            print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    xb, yb = get_batch("train")
    _, loss = model(xb, yb)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()

if ddp_rank == 0:
    torch.save(
        {
            "model": model.module.state_dict(),
            "optimizer": optimizer.state_dict(),
            "iter": max_iters,
        },
        "ckpt.pt",
    )
dist.destroy_process_group()
