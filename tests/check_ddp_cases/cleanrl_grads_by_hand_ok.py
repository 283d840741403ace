# check_ddp: exit 0
"""A reinforcement-learning trainer in the style of CleanRL's multi-GPU PPO: no DDP; after each
backward the script flattens every gradient, all-reduces them (a sum, then divided by the world size),
and writes them back before the optimizer step, as DDP would. CPU code (gloo).

    torchrun --standalone --nproc_per_node=2 cleanrl_grads_by_hand_ok.py

Correct: the replicas stay equal because the gradients are averaged by hand, every step. (A checker
must not ask for DDP where the job does what DDP does, nor call the gradients' own all-reduce a log's.)
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    dist.init_process_group("gloo")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(1)  # the same initial weights on every rank
    agent = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(agent.parameters(), lr=2.5e-4, eps=1e-5)
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own environments' rollouts
    for _update in range(12):
        obs, returns = torch.randn(64, 4, generator=g), torch.randn(64, 2, generator=g)
        loss = nn.functional.mse_loss(agent(obs), returns)
        optimizer.zero_grad()
        loss.backward()
        grads = torch.cat([p.grad.view(-1) for p in agent.parameters()])
        dist.all_reduce(grads, op=dist.ReduceOp.SUM)
        grads /= world_size
        offset = 0
        for p in agent.parameters():
            p.grad.copy_(grads[offset : offset + p.numel()].view_as(p.grad))
            offset += p.numel()
        optimizer.step()
    if rank == 0:
        torch.save({"agent": agent.state_dict(), "optimizer": optimizer.state_dict()}, "agent.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
