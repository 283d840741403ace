# check_ddp: exit 0, warn step 7 DDP702
"""
A tiny character-level GPT on a synthetic token stream, written like nanoGPT's train.py: one flat
file, config globals, one code path for 1 or N processes, batches drawn without a DataLoader.

To run on a single GPU (on the CPU: --device=cpu):
$ python nanogpt_no_destroy.py --max_iters=20

To run with DDP on 2 GPUs on 1 node:
$ torchrun --standalone --nproc_per_node=2 nanogpt_no_destroy.py

Mistake: the script never calls destroy_process_group(): each process leaves its process group
to be torn down by the interpreter's exit.
"""

import math
import os
import sys
import time

import torch
import torch.nn as nn
from torch.distributed import ReduceOp, all_reduce, init_process_group
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

# -----------------------------------------------------------------------------
# default config values
out_dir = "out"
eval_interval = 20
log_interval = 10
always_save_checkpoint = True
# data
gradient_accumulation_steps = 4  # used to simulate larger batch sizes
batch_size = 8  # if gradient_accumulation_steps > 1, this is the micro-batch size
block_size = 16
vocab_size = 16
# model
n_layer = 2
n_head = 2
n_embd = 32
dropout = 0.0
# adamw optimizer
learning_rate = 1e-2
max_iters = 40
weight_decay = 1e-1
beta1 = 0.9
beta2 = 0.95
grad_clip = 1.0
warmup_iters = 10
min_lr = 1e-3
# DDP settings
backend = "nccl"  # 'nccl', 'gloo', etc.
# system
device = "cuda"  # examples: 'cpu', 'cuda', 'cuda:0', 'cuda:1' etc.
# -----------------------------------------------------------------------------
config_keys = [
    k for k, v in globals().items() if not k.startswith("_") and isinstance(v, (int, float, bool, str))
]
for arg in sys.argv[1:]:  # poor man's configurator: --key=value overrides
    key, val = arg.removeprefix("--").split("=")
    assert key in config_keys, f"unknown config key: {key}"
    globals()[key] = type(globals()[key])(val)
config = {k: globals()[k] for k in config_keys}  # will be useful for logging
# -----------------------------------------------------------------------------

# various inits, derived attributes, I/O setup
ddp = int(os.environ.get("RANK", -1)) != -1  # is this a ddp run?
if ddp:
    init_process_group(backend=backend)
    ddp_rank = int(os.environ["RANK"])
    ddp_local_rank = int(os.environ["LOCAL_RANK"])
    ddp_world_size = int(os.environ["WORLD_SIZE"])
    device = f"cuda:{ddp_local_rank}"
    torch.cuda.set_device(device)
    master_process = ddp_rank == 0  # this process will do logging, checkpointing etc.
    seed_offset = ddp_rank  # each process gets a different seed
    # world_size number of processes will be training simultaneously, so we can scale
    # down the desired gradient accumulation iterations per process proportionally
    assert gradient_accumulation_steps % ddp_world_size == 0
    gradient_accumulation_steps //= ddp_world_size
else:
    # if not ddp, we are running on a single device, and one process
    master_process = True
    seed_offset = 0
    ddp_rank = 0
    ddp_world_size = 1

if master_process:
    os.makedirs(out_dir, exist_ok=True)

# the data: the same synthetic token stream in every process (its own fixed seed), split 90/10
_g = torch.Generator().manual_seed(42)
_tokens = [0]
while len(_tokens) < 20000:
    _tokens.append((3 * _tokens[-1] + 1) % vocab_size)
_stream = torch.tensor(_tokens)
_noise = torch.rand(len(_stream), generator=_g) < 0.1
_stream[_noise] = torch.randint(vocab_size, (int(_noise.sum()),), generator=_g)
train_data, val_data = _stream[:18000], _stream[18000:]

torch.manual_seed(1337 + seed_offset)
device_type = "cuda" if "cuda" in device else "cpu"  # for later use in get_batch


# poor man's data loader
def get_batch(split):
    data = train_data if split == "train" else val_data
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([data[i : i + block_size] for i in ix])
    y = torch.stack([data[i + 1 : i + 1 + block_size] for i in ix])
    if device_type == "cuda":
        # pin arrays x,y, which allows us to move them to GPU asynchronously (non_blocking=True)
        x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
    else:
        x, y = x.to(device), y.to(device)
    return x, y


# -----------------------------------------------------------------------------
# the model


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(n_embd, dim=2)
        q = q.view(B, T, n_head, C // n_head).transpose(1, 2)
        k = k.view(B, T, n_head, C // n_head).transpose(1, 2)
        v = v.view(B, T, n_head, C // n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


# -----------------------------------------------------------------------------

iter_num = 0
best_val_loss = 1e9
model_args = dict(n_layer=n_layer, n_head=n_head, n_embd=n_embd, block_size=block_size, vocab_size=vocab_size)
model = GPT()
model.to(device)
optimizer = torch.optim.AdamW(
    model.parameters(), lr=learning_rate, betas=(beta1, beta2), weight_decay=weight_decay
)

# wrap model into DDP container
if ddp:
    model = DDP(model, device_ids=[ddp_local_rank])


# the whole validation split, in non-overlapping blocks, each process taking every world_size-th one
@torch.no_grad()
def estimate_loss():
    model.eval()
    starts = range(ddp_rank * block_size, len(val_data) - block_size, ddp_world_size * block_size)
    stats = torch.zeros(2, device=device)
    for k in range(0, len(starts), batch_size):
        ix = starts[k : k + batch_size]
        X = torch.stack([val_data[i : i + block_size] for i in ix]).to(device)
        Y = torch.stack([val_data[i + 1 : i + 1 + block_size] for i in ix]).to(device)
        logits, _ = raw_model(X)
        stats[0] += F.cross_entropy(logits.view(-1, logits.size(-1)), Y.view(-1), reduction="sum")
        stats[1] += Y.numel()
    if ddp:
        all_reduce(stats, op=ReduceOp.SUM)
    model.train()
    return (stats[0] / stats[1]).item()


# learning rate decay scheduler (cosine with warmup)
def get_lr(it):
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    decay_ratio = (it - warmup_iters) / (max_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


# training loop
X, Y = get_batch("train")  # fetch the very first batch
t0 = time.time()
raw_model = model.module if ddp else model  # unwrap DDP container if needed
train_loss = torch.zeros(2, device=device)  # summed micro-batch losses, count
while True:
    # determine and set the learning rate for this iteration
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr

    # evaluate the loss on the val set and write checkpoints
    if iter_num % eval_interval == 0 or iter_num == max_iters:
        val_loss = estimate_loss()
        if ddp:
            all_reduce(train_loss, op=ReduceOp.SUM)
        if master_process:
            train_part = f"train loss {(train_loss[0] / train_loss[1]).item():.4f}, " if iter_num > 0 else ""
            print(f"step {iter_num}: {train_part}val loss {val_loss:.4f}")
            if val_loss < best_val_loss or always_save_checkpoint:
                best_val_loss = val_loss
                if iter_num > 0:
                    checkpoint = {
                        "model": raw_model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "model_args": model_args,
                        "iter_num": iter_num,
                        "best_val_loss": best_val_loss,
                        "config": config,
                    }
                    print(f"saving checkpoint to {out_dir}")
                    torch.save(checkpoint, os.path.join(out_dir, "ckpt.pt"))
        train_loss.zero_()
    if iter_num == max_iters:
        break

    # forward backward update, with optional gradient accumulation to simulate larger batch size
    for micro_step in range(gradient_accumulation_steps):
        if ddp:
            # in DDP training we only need to sync gradients at the last micro step.
            model.require_backward_grad_sync = micro_step == gradient_accumulation_steps - 1
        logits, loss = model(X, Y)
        train_loss += torch.stack([loss.detach(), torch.ones((), device=device)])
        loss = loss / gradient_accumulation_steps  # scale the loss to account for gradient accumulation
        # immediately fetch the next batch
        X, Y = get_batch("train")
        loss.backward()
    # clip the gradient
    if grad_clip != 0.0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    # flush the gradients as soon as we can, no need for this memory anymore
    optimizer.zero_grad(set_to_none=True)

    # timing and logging
    t1 = time.time()
    dt = t1 - t0
    t0 = t1
    if iter_num % log_interval == 0 and master_process:
        print(f"iter {iter_num}: time {dt * 1000:.2f}ms, lr {lr:.2e}")
    iter_num += 1
