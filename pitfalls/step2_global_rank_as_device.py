"""A pitfall of DDP step 2: the global rank as the GPU index: torch.device("cuda", rank), device_ids=[rank].

    python pitfalls/step2_global_rank_as_device.py

RANK numbers the processes of the whole job, LOCAL_RANK those of one node. On one node
they are equal, so the mistake hides; on the second node of a 2 x 2 GPU job, RANK is
2 and 3, and the guide's code asks for cuda:2 and cuda:3, GPUs that node does not have.
Two nodes are simulated here: two torchrun agents on this machine, 2 processes each,
meeting by c10d rendezvous. Only the device each process would ask for is printed:
without GPUs, none can be opened. (On a real node, torch.cuda.set_device(2) fails with
"CUDA error: invalid device ordinal"; not shown here.)
"""

import os
import sys
from concurrent.futures import ThreadPoolExecutor

import torch.distributed as dist
from _launch import free_port, report, results, tell, torchrun


def worker():  # each process of the job, started by one of the two torchrun agents
    dist.init_process_group("gloo")  # one job of 4 processes across the two "nodes"
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    dist.barrier()
    tell(
        node=int(os.environ["GROUP_RANK"]),
        rank=rank,
        mistake=f"cuda:{rank}",  # the guide: torch.device("cuda", rank), DDP(model, device_ids=[rank])
        fix=f"cuda:{local_rank}",  # torch.device("cuda", local_rank), DDP(model, device_ids=[local_rank])
        world_size=dist.get_world_size(),
    )
    dist.destroy_process_group()


def main():
    endpoint = f"127.0.0.1:{free_port()}"

    def node(is_host):  # one torchrun agent, as on one machine of a 2-node job
        rendezvous = f"--rdzv-backend=c10d --rdzv-endpoint={endpoint} --rdzv-id=global_rank_device --nnodes=2"
        options = (*rendezvous.split(), f"--rdzv-conf=is_host={is_host}")
        return torchrun(__file__, "worker", nproc=2, options=options)

    with ThreadPoolExecutor(2) as pool:  # both nodes at once: the rendezvous waits for both
        nodes = list(pool.map(node, (1, 0)))
    said = sorted(results(nodes[0]) + results(nodes[1]), key=lambda p: p["rank"])
    second = [p for p in said if p["node"] == 1]

    def devices(way):
        return ", ".join(f"rank {p['rank']} {p[way]}" for p in second)

    report(
        mistake='device = torch.device("cuda", rank); DDP(model, device_ids=[rank])  # the global rank',
        symptom=f"on the second node of a 2 x 2 GPU job: {devices('mistake')}: GPUs it does not have",
        fix='device = torch.device("cuda", local_rank); DDP(model, device_ids=[local_rank])  # LOCAL_RANK',
        result=f"on the second node: {devices('fix')}",
        checks={
            "one job of 4 processes on 2 nodes": [p["rank"] for p in said] == [0, 1, 2, 3]
            and all(p["world_size"] == 4 for p in said),
            "the mistake asks for cuda:2 and cuda:3": [p["mistake"] for p in second] == ["cuda:2", "cuda:3"],
            "the fix asks for cuda:0 and cuda:1": [p["fix"] for p in second] == ["cuda:0", "cuda:1"],
        },
        runs=nodes,
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker()
    else:
        main()
