# check_ddp: exit 0
"""A nanoGPT-flavoured flat script with no DataLoader: a generator of batches that reads this
rank's contiguous block of a (synthetic) token corpus as a stream and shuffles it through a
sliding window, as people write for corpora too big to index; a fixed number of steps an epoch.

    torchrun --standalone --nproc_per_node=2 d2_window_shuffle_stream.py

Correct: window_stream() gives rank r the block [r*L, (r+1)*L) of the examples (disjoint blocks,
equal length L = N // world_size), loops over it endlessly and emits each example from a
window of 48 pending ones picked at random (random.Random(seed + rank)); the window is never
flushed, so one pass of L draws may hold an example twice and miss another: a streaming
shuffle's property, not an overlap between ranks. Every rank takes steps_per_epoch batches, so
the ranks stay in step; the training loss and the held-out sums are all-reduced: exit 0.
"""

import os
import random

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
vocab_size = 50
context = 8
n_embd = 16
batch_size = 24
window = 48
epochs = 3
learning_rate = 3e-3
seed = 1337
# -----------------------------------------------------------------------------

ddp_local_rank = int(os.environ["LOCAL_RANK"])
device = f"cuda:{ddp_local_rank}" if torch.cuda.is_available() else "cpu"
if device.startswith("cuda"):
    torch.cuda.set_device(device)
dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
ddp_rank = dist.get_rank()
ddp_world_size = dist.get_world_size()
master_process = ddp_rank == 0

# synthetic corpus: next token = (sum of the context) mod vocab, with noise
g = torch.Generator().manual_seed(seed)
X = torch.randint(0, vocab_size, (1500, context), generator=g)
Y = (X.sum(1) + torch.randint(0, 2, (1500,), generator=g)) % vocab_size
X_train, Y_train, X_val, Y_val = X[:1200], Y[:1200], X[1200:], Y[1200:]


def window_stream(n, rank, world_size, window, rng):
    """Endless stream of indices from this rank's block, shuffled through a window."""
    per_rank = n // world_size
    block = range(rank * per_rank, (rank + 1) * per_rank)
    pending = []
    while True:
        for i in block:
            pending.append(i)
            if len(pending) >= window:
                yield pending.pop(rng.randrange(len(pending)))


def get_batches(stream):
    while True:
        idx = torch.tensor([next(stream) for _ in range(batch_size)])
        yield X_train[idx].to(device), Y_train[idx].to(device)


class BagLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Parameter(torch.zeros(context, n_embd))
        self.lm_head = nn.Linear(n_embd, vocab_size)

    def forward(self, idx):
        h = (self.wte(idx) + self.wpe).mean(1)
        return self.lm_head(torch.tanh(h))


torch.manual_seed(seed)
model = BagLM().to(device)
model = DDP(model, device_ids=[ddp_local_rank] if device.startswith("cuda") else None)
raw_model = model.module
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)

batches = get_batches(
    window_stream(len(X_train), ddp_rank, ddp_world_size, window, random.Random(seed + ddp_rank))
)
steps_per_epoch = (len(X_train) // ddp_world_size) // batch_size

# held-out: every world_size-th example from this rank on
xv, yv = X_val[ddp_rank::ddp_world_size].to(device), Y_val[ddp_rank::ddp_world_size].to(device)

for epoch in range(epochs):
    model.train()
    loss_sum = torch.zeros((), device=device)
    seen = 0
    for _step in range(steps_per_epoch):
        xb, yb = next(batches)
        logits = model(xb)
        loss = F.cross_entropy(logits, yb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_sum += loss.detach() * len(yb)
        seen += len(yb)
    train_stats = torch.stack([loss_sum, loss_sum.new_tensor(seen)])
    dist.all_reduce(train_stats)

    model.eval()
    with torch.no_grad():
        val_stats = torch.stack(
            [F.cross_entropy(raw_model(xv), yv, reduction="sum"), torch.tensor(float(len(yv)), device=device)]
        )
    dist.all_reduce(val_stats)
    if master_process:
        print(
            f"epoch {epoch}: train loss {(train_stats[0] / train_stats[1]).item():.4f}, "
            f"val loss {(val_stats[0] / val_stats[1]).item():.4f}"
        )
        torch.save(
            {"model": raw_model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch},
            "d2_ckpt.pt",
        )

dist.destroy_process_group()
