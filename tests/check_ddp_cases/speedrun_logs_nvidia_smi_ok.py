# check_ddp: exit 0
"""A language-model speedrun in the style of modded-nanogpt's train_gpt.py: rank 0 opens a log, writes
the code and the hardware it runs on (the output of `nvidia-smi`, run as a program), then every rank
trains on its own slice of a token stream, and rank 0 logs the loss. GPU only.

    torchrun --standalone --nproc_per_node=2 speedrun_logs_nvidia_smi_ok.py

Correct. What a checker must not get wrong here: `nvidia-smi` is a GPU machine's program; on a machine
without one it does not exist, and the error that raises is a GPU's absence (not checked), never the
script's.
"""

import os
import subprocess

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


class TinyLM(nn.Module):
    def __init__(self, vocab=64, dim=32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx, targets):
        logits = self.head(self.embed(idx))
        return nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    dist.init_process_group("nccl")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    torch.cuda.set_device(device)
    master_process = rank == 0

    if master_process:  # the run's log: what ran, and on what
        with open("speedrun_log.txt", "w") as f:
            f.write(f"Running pytorch {torch.__version__}, CUDA {torch.version.cuda}\nnvidia-smi:\n")
            result = subprocess.run(["nvidia-smi"], capture_output=True, text=True)  # check_ddp: here
            f.write(f"{result.stdout}\n")

    model = DDP(TinyLM().to(device), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 64, (world_size * 8 * 17 * 10,), generator=torch.Generator().manual_seed(0))
    batch, seq = 8, 16
    for step in range(10):  # each rank its own slice of the stream, step by step
        start = (step * world_size + rank) * batch * (seq + 1)
        chunk = tokens[start : start + batch * (seq + 1)].view(batch, seq + 1).to(device)
        loss = model(chunk[:, :-1], chunk[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if master_process and step % 5 == 4:
            print(f"step {step + 1}: train loss {loss.item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
