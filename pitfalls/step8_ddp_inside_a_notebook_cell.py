"""A pitfall of DDP step 8: DDP started inside a notebook cell: mp.spawn of a function the cell defines.

    python pitfalls/step8_ddp_inside_a_notebook_cell.py

mp.spawn starts fresh Python processes, and each must import the function it is to run
by its module's name, here `__main__.train`. A notebook's `__main__` is no file: the
children cannot import it, each fails to unpickle the function, and the cell raises.
Shown with a kernel of our own, `python -c`, whose `__main__` has neither a file nor a
module name, as ipykernel's has neither (code fed on stdin is not the same: its
`__file__` is '<stdin>', and the children fail to open that instead). The kernel runs
the notebook's cells one after another in its `__main__`, and shows a cell's error as
Jupyter does; the children's own errors go to its stderr, shown in the cell's output.
Two ways out, both shown: the function in a script, run with torchrun from the cell (as
walkthrough.ipynb runs train_ddp.py, with `python -m torch.distributed.run`); or a
launcher that starts the script's function: `import ddp_cell`, then
mp.spawn(ddp_cell.train, ...), whose children import ddp_cell by name.
Notebook launchers (accelerate's notebook_launcher, Lightning's "ddp_notebook") fork the
kernel instead: a fork imports nothing, and runs the cell's own function, shown too. But
a forked child cannot use CUDA once the kernel has initialised it (with a tensor put on
the GPU, say): it raises "Cannot re-initialize CUDA in forked subprocess". Not shown:
that needs a GPU.
"""

import json
import os
import re
import sys
import tempfile

from _launch import error_line, report, run

# the cell that defines the training function; %%writefile would put the same text in a script
TRAIN = """
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from _launch import TIMEOUT_S, tell


def train(rank, world_size):
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(seconds=TIMEOUT_S))
    total = torch.ones(1)
    dist.all_reduce(total)  # every rank adds its 1
    tell(rank=rank, ranks=int(total.item()))
    dist.destroy_process_group()
"""

# what the script adds: under torchrun, each process reads its rank and the world size from its environment
MAIN = """
if __name__ == "__main__":
    train(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))
"""

# the notebook's cells, run in this order in one kernel; they share its variables, as cells do
CELLS = {
    "mistake": TRAIN + "\nimport torch.multiprocessing as mp\n\nmp.spawn(train, args=(2,), nprocs=2)\n",
    "torchrun": """
import subprocess, sys

with open("ddp_cell.py", "w") as script:  # as %%writefile ddp_cell.py would, from the cell's text
    script.write(TRAIN + MAIN)
torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
subprocess.run([*torchrun, "ddp_cell.py"], check=True, timeout=60)
""",
    "spawn from a file": "import ddp_cell\n\nmp.spawn(ddp_cell.train, args=(2,), nprocs=2)\n",
    "fork": 'mp.start_processes(train, args=(2,), nprocs=2, start_method="fork")\n',
}

# the kernel: runs each cell in its __main__, as Jupyter does, and shows the cell's error, if any
KERNEL = """
import os, sys
from _launch import free_port

for name, cell in zip(sys.argv[1::2], sys.argv[2::2], strict=True):
    os.environ["MASTER_PORT"] = str(free_port())  # where mp.spawn's processes meet: a port of their own
    print(f"In [{name}]:", flush=True)
    try:
        exec(cell, globals())
    except Exception as error:  # Jupyter shows its traceback, which ends in this line
        print(f"{type(error).__module__}.{type(error).__name__}: {error}", flush=True)
"""


def cell_outputs(stdout):
    """What each cell printed, by its name."""
    parts = re.split(r"^In \[(.+)\]:\n", stdout, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def joined(output):
    """How many ranks of a cell's job joined the others (all-reduced, and counted 2 ranks)."""
    said = [json.loads(line[7:]) for line in output.splitlines() if line.startswith("RESULT ")]
    return len({p["rank"] for p in said if p["ranks"] == 2})


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    # the kernel and its children import _launch from here; mp.spawn's processes meet at MASTER_ADDR
    env = dict(os.environ, PYTHONPATH=here, MASTER_ADDR="127.0.0.1")
    kernel_code = f"TRAIN, MAIN = {TRAIN!r}, {MAIN!r}\n{KERNEL}"
    cells = [part for name, cell in CELLS.items() for part in (name, cell)]
    with tempfile.TemporaryDirectory() as folder:  # the notebook's folder
        kernel = run([sys.executable, "-c", kernel_code, *cells], env=env, cwd=folder, timeout=80)
    out = cell_outputs(kernel.stdout)
    raised = error_line(out.get("mistake", ""))
    child_error = error_line(kernel.stderr, r"^AttributeError: Can't get attribute 'train'")
    ran = {name: joined(out.get(name, "")) for name in ("torchrun", "spawn from a file", "fork")}
    report(
        mistake="in a cell: def train(rank, world_size): ...  then  mp.spawn(train, args=(2,), nprocs=2)",
        symptom=f"each child, as it starts: {child_error}\nthen the cell: {raised}",
        fix="1. the function in a script, run from the cell with torchrun (as walkthrough.ipynb does):\n"
        "   python -m torch.distributed.run --standalone --nproc_per_node=2 ddp_cell.py\n"
        "2. or a launcher that starts the script's function: import ddp_cell; mp.spawn(ddp_cell.train, ...)",
        result=f"{ran['torchrun']} of 2 ranks joined under torchrun, {ran['spawn from a file']} of 2 with"
        " mp.spawn; a fork (as notebook launchers do)\n"
        f"runs the cell's own train, {ran['fork']} of 2 joined, but only while the kernel has not initialised"
        " CUDA:\nRuntimeError: Cannot re-initialize CUDA in forked subprocess (not shown: that needs a GPU)",
        checks={
            "the children could not import the cell's function": child_error != "",
            "the cell raised": "spawn.ProcessExitedException: process" in raised,
            "no rank of the mistake ran": joined(out.get("mistake", "")) == 0,
            "the script ran under torchrun": ran["torchrun"] == 2,
            "the script's function ran under mp.spawn": ran["spawn from a file"] == 2,
            "a fork ran the cell's function": ran["fork"] == 2,
            "every other cell ran without an error": kernel.returncode == 0
            and not any(error_line(out.get(name, "")) for name in ran),
        },
        runs=(kernel,),
    )


if __name__ == "__main__":
    main()
