# check_ddp: exit 0, warn step 6 DDP608
"""A small GAN-style two-model script in the manner of many research repos: a generator and a
critic, each in DDP, `state_dict()` of both saved each epoch to last.pt, and the run picking up from
last.pt when it finds one (here: before a final extra epoch). GPU only.

    torchrun --standalone --nproc_per_node=2 gan_reloads_wrapped.py

Not quite right: the checkpoint holds the DDP wrappers' state (module. keys). The script loads it back
into its DDP models, so its own resume works, but no other script can load last.pt as it is.
"""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def epoch_of(gen, critic, loader, sampler, opt_g, opt_c, device, epoch):
    sampler.set_epoch(epoch)
    stats = torch.zeros(3, device=device)
    for (real,) in loader:
        real = real.to(device)
        z = torch.randn(len(real), 8, device=device)
        loss_c = critic(gen(z).detach()).mean() - critic(real).mean()
        opt_c.zero_grad()
        loss_c.backward()
        opt_c.step()
        loss_g = -critic(gen(z)).mean()
        opt_g.zero_grad()
        loss_g.backward()
        opt_g.step()
        stats += torch.stack([loss_c.detach(), loss_g.detach(), torch.ones((), device=device)])
    dist.all_reduce(stats)
    return stats


def main(epochs=2):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl")
    g = torch.Generator().manual_seed(5)
    data = TensorDataset(torch.randn(512, 4, generator=g) * 0.5 + 1.0)
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=64, sampler=sampler)
    torch.manual_seed(5)
    gen = DDP(
        nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(device),
        device_ids=[local_rank],
    )
    critic = DDP(
        nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1)).to(device),
        device_ids=[local_rank],
    )
    opt_g = torch.optim.Adam(gen.parameters(), lr=1e-3, betas=(0.5, 0.9))
    opt_c = torch.optim.Adam(critic.parameters(), lr=1e-3, betas=(0.5, 0.9))
    for epoch in range(epochs + 1):
        if epoch == epochs and os.path.exists("last.pt"):  # the run picks up from its last checkpoint
            state = torch.load("last.pt", map_location=device)
            gen.load_state_dict(state["gen"])
            critic.load_state_dict(state["critic"])
            opt_g.load_state_dict(state["opt_g"])
            opt_c.load_state_dict(state["opt_c"])
        stats = epoch_of(gen, critic, loader, sampler, opt_g, opt_c, device, epoch)
        if dist.get_rank() == 0:
            print(f"epoch {epoch}: critic {stats[0] / stats[2]:.3f} generator {stats[1] / stats[2]:.3f}")
            if epoch < epochs:
                torch.save(  # check_ddp: here
                    {
                        "gen": gen.state_dict(),
                        "critic": critic.state_dict(),
                        "opt_g": opt_g.state_dict(),
                        "opt_c": opt_c.state_dict(),
                    },
                    "last.pt",
                )
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
