# check_ddp: exit 0
"""A learner's FSDP2 language model as PyTorch's FSDP2 tutorial builds one: the model made on the meta
device (shapes, no memory), each block of its ModuleList drawn on the CPU and sharded, then the root's
own parameters (the embeddings, the last norm, the head) drawn on the CPU and left there: fully_shard on
the root moves them to its mesh's device, the rank's GPU, as it moves every module it shards.

    torchrun --standalone --nproc_per_node=2 fsdp2_meta_blocks_root_on_cpu_ok.py

No mistake: fully_shard(model, mesh=mesh) on a mesh of GPUs moves what it shards there, wherever the
script left it (torch's _move_states_to_device); no rank ever holds the whole model. The script never
calls torch.cuda.set_device: init_device_mesh("cuda", ...) sets the GPU of LOCAL_RANK where none is set.
"""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

VOCAB, WIDTH, LENGTH = 32, 32, 8


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(), nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class TinyLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(3))
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def draw(module):
    """A module made on the meta device, given memory on the CPU and its own first weights."""
    module.to_empty(device="cpu")
    for part in module.modules():
        if hasattr(part, "reset_parameters"):
            part.reset_parameters()


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl")
    mesh = dist.init_device_mesh("cuda", (dist.get_world_size(),))  # sets this rank's GPU: LOCAL_RANK's
    torch.manual_seed(0)
    with torch.device("meta"):
        model = TinyLM()
    for block in model.blocks:
        draw(block)
        fully_shard(block, mesh=mesh)
    for part in (model.embed, model.norm, model.head):
        draw(part)
    fully_shard(model, mesh=mesh)  # the root: what the blocks left, moved to this rank's GPU
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(VOCAB, (256, LENGTH + 1), generator=g)
    data = TensorDataset(tokens[:, :-1], tokens[:, 1:])
    sampler = DistributedSampler(data, seed=0)
    loader = DataLoader(data, batch_size=16, sampler=sampler)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        totals = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            totals += torch.stack([loss.detach() * len(x), torch.tensor(float(len(x)), device=device)])
        dist.all_reduce(totals)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: loss {(totals[0] / totals[1]).item():.4f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
