"""A pitfall of DDP step 1: MASTER_ADDR and MASTER_PORT hard-coded in a script that torchrun starts.

    python pitfalls/step1_hardcoded_master_port.py

The guide writes os.environ["MASTER_PORT"] = "12355" before init_process_group. torchrun
has already set MASTER_ADDR/MASTER_PORT to the store it serves, and in torch 2.13 its
workers share that store: they only connect to it, none serves one of its own (unless
TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1). With the guide's port they connect to a port
nobody serves, and wait for the process group's timeout: 30 minutes by default (10 with
nccl), 3 s here. With the sharing off, rank 0 serves the hard-coded port itself and the
job runs, on one node, one job at a time: shown too.
"""

import os
import sys
from datetime import timedelta

import torch.distributed as dist
from _launch import TIMEOUT_S, error_line, free_port, report, tell, told, torchrun


def worker(mode, port):  # each process of the job, started by torchrun
    if mode == "mistake":
        os.environ["MASTER_ADDR"] = "localhost"  # the guide's two lines
        os.environ["MASTER_PORT"] = port
    dist.init_process_group("gloo", timeout=timedelta(seconds=TIMEOUT_S))
    dist.barrier()
    tell(joined=dist.get_rank())
    dist.destroy_process_group()


def main():
    port = str(free_port(preferred=12355))  # the guide's port, unless something on this machine holds it
    mistake = torchrun(__file__, "mistake", port)
    fix = torchrun(__file__, "fix", port)
    # the same mistake with the store sharing off: rank 0 serves the hard-coded port itself
    unshared = torchrun(
        __file__, "mistake", port, env=dict(os.environ, TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    )
    timed_out = error_line(mistake.stderr, "DistNetworkError: .*timed out")
    report(
        mistake=f'os.environ["MASTER_PORT"] = "{port}"  (and MASTER_ADDR = "localhost"), under torchrun',
        symptom=f"every worker waits {TIMEOUT_S} s for a store nobody serves, then:\n{timed_out}",
        fix="set neither: init_process_group reads the address and port torchrun gives",
        result=f"{len(told(fix))} of 2 ranks joined, exit {fix.returncode}\n"
        f"(the mistake with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 exits {unshared.returncode}:"
        " rank 0 serves the port itself; on one node, one job at a time)",
        checks={
            "the mistake timed out connecting": mistake.returncode == 1 and port in timed_out,
            "the fix joined": fix.returncode == 0 and len(told(fix)) == 2,
            "the mistake runs without store sharing": unshared.returncode == 0,
        },
        runs=(mistake, fix, unshared),
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker(*sys.argv[1:])
    else:
        main()
