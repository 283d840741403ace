"""A pitfall of DDP step 8: on a CPU, each process using every core: more threads than cores.

    python pitfalls/step8_too_many_threads.py

PyTorch gives each process as many threads as there are cores. With N processes on one
machine that is N times too many: they take turns on the cores, and wait on each other.
torchrun sets OMP_NUM_THREADS=1 for its workers, but only when --nproc_per_node is
above 1 and OMP_NUM_THREADS is unset: an OMP_NUM_THREADS exported in the shell (or
torch.set_num_threads(os.cpu_count()) in the script) brings the problem back.
Both ways are timed side by side. Timings depend on the machine and on what else runs
on it, so this pitfall only checks that both ran; the numbers are the lesson.
"""

import os
import sys
import time

import torch
import torch.distributed as dist
from _launch import report, results, tell, torchrun

STEPS = 20


def worker():  # each process of the job, started by torchrun
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    # both processes compute training steps at once, as DDP's do; DDP itself is left out:
    # its all-reduces would only add time, and the threads compete in the compute
    model = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(256, 256)
    for step in range(3 + STEPS):  # 3 steps to warm up, then the clock starts
        if step == 3:
            dist.barrier()  # both processes start together
            start = time.perf_counter()
        model(x).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    dist.barrier()
    tell(
        rank=dist.get_rank(), threads=torch.get_num_threads(), ms=1000 * (time.perf_counter() - start) / STEPS
    )
    dist.destroy_process_group()


def main():
    cores = len(os.sched_getaffinity(0))  # the cores this process may use
    unset = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    mistake = results(torchrun(__file__, "worker", env=dict(unset, OMP_NUM_THREADS=str(cores))))
    fix = results(torchrun(__file__, "worker", env=unset))  # torchrun sets OMP_NUM_THREADS=1
    # a job goes at its slowest process's pace
    mistake = {"threads": mistake[0]["threads"], "ms": max(p["ms"] for p in mistake)}
    fix = {"threads": fix[0]["threads"], "ms": max(p["ms"] for p in fix)}
    ratio = mistake["ms"] / fix["ms"]
    report(
        mistake=f"OMP_NUM_THREADS={cores} (all {cores} cores) for each of 2 processes: "
        f"{2 * mistake['threads']} threads on {cores} cores",
        symptom=f"{mistake['ms']:.1f} ms per training step",
        fix="leave OMP_NUM_THREADS unset (torchrun sets 1), or set it to cores / processes",
        result=f"{fix['ms']:.1f} ms per step with {fix['threads']} thread each: the mistake is"
        + (f" {ratio:.1f} times slower" if ratio > 1 else " not slower on this machine, this time"),
        checks={"both ran and were timed": mistake["threads"] == cores and fix["threads"] == 1},
    )


if __name__ == "__main__":
    if len(sys.argv) > 1:
        worker()
    else:
        main()
