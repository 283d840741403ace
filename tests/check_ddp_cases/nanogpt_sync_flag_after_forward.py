# check_ddp: exit 1, FAIL step 9 DDP902, warn step 5 DDP506, see step9_accumulation_without_no_sync
"""nanoGPT-style accumulation, with the line that decides whether a micro-batch all-reduces moved
below the forward pass: `model.require_backward_grad_sync = (micro_step == K - 1)`, set after
`logits, loss = model(X, Y)`. GPU only.

    torchrun --standalone --nproc_per_node=2 nanogpt_sync_flag_after_forward.py

Mistake: DDP reads require_backward_grad_sync in forward(), not in backward(): set after the forward,
the flag is always one micro-batch late, the last micro-batch's backward never all-reduces, and every
rank steps on gradients of its own. The replicas drift apart (what a check sees at DDP step 4); the
cause is DDP step 9's. Use model.no_sync() around the first K-1 micro-batches instead.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

gradient_accumulation_steps, batch_size, block_size, max_iters = 2, 8, 8, 12
dist.init_process_group(backend="nccl")
ddp_rank, ddp_local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
device = f"cuda:{ddp_local_rank}"
torch.cuda.set_device(device)
master_process = ddp_rank == 0
torch.manual_seed(1337 + ddp_rank)

data = torch.arange(3000) % 31


def get_batch():
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i : i + block_size] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix])
    return x.to(device), y.to(device)


class Bigram(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(31, 31)

    def forward(self, idx, targets):
        logits = self.emb(idx)
        return logits, nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


torch.manual_seed(1337)
model = DDP(Bigram().to(device), device_ids=[ddp_local_rank])
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
torch.manual_seed(1337 + ddp_rank)
X, Y = get_batch()
for it in range(max_iters):
    for micro_step in range(gradient_accumulation_steps):
        logits, loss = model(X, Y)
        model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        loss = loss / gradient_accumulation_steps
        X, Y = get_batch()
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if master_process and it % 4 == 0:
        print(f"iter {it}: loss {loss.item() * gradient_accumulation_steps:.4f}")
if master_process:
    torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, "ckpt.pt")
dist.destroy_process_group()
