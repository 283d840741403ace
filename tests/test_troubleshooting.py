"""docs/troubleshooting.md's rows for a hang mid-run say what a job really prints, and after how long:
gloo's by a job that hangs, nccl's by the torch installed, on any build of it."""

import math
import re
from datetime import timedelta
from pathlib import Path

import torch.distributed.constants
from helpers import ROOT, run

PAGE = (ROOT / "docs" / "troubleshooting.md").read_text()
SECONDS = 2  # the job's timeout: short, so that it fails in seconds instead of 30 minutes

# Two ranks that disagree: rank 0 all-reduces, rank 1 waits at a barrier; neither call can finish.
DISAGREE = f"""import datetime
import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds={SECONDS}))
if dist.get_rank() == 0:
    dist.all_reduce(torch.ones(1))
else:
    dist.barrier()
"""


def timeout_row(backend):
    """The row's first cell, and its message: a hang mid-run on backend, after N minutes."""
    row = re.search(
        rf"^\| On \w+ \({backend}\): a hang mid-run, then, after (\d+) minutes, `([^`]+)`", PAGE, re.M
    )
    assert row, f"docs/troubleshooting.md has no row for a {backend} timeout"
    return timedelta(minutes=int(row.group(1))), row.group(2)


def as_pattern(message, milliseconds, instead):
    """The row's message as a regex: its ... matches anything, its timeout in ms becomes instead."""
    assert str(milliseconds) in message, f"{message!r} does not give the timeout, {milliseconds} ms"
    parts = [re.escape(part) for part in message.replace(str(milliseconds), "\0").split("...")]
    return ".*?".join(parts).replace("\0", str(instead))


def test_the_gloo_timeout_row_is_what_a_gloo_job_prints(tmp_path):
    after, message = timeout_row("gloo")
    assert after == torch.distributed.constants.default_pg_timeout, (
        "the row's minutes are not torch's default"
    )
    (tmp_path / "disagree.py").write_text(DISAGREE)
    proc = run("torchrun --standalone --nproc_per_node=2 disagree.py", cwd=tmp_path, timeout=60, expect=1)
    milliseconds = int(after.total_seconds() * 1000)
    pattern = as_pattern(message, milliseconds, instead=SECONDS * 1000)
    assert re.search(pattern, proc.stderr), f"the job never printed {message!r}:\n{proc.stderr}"


def nccl_default():
    """torch's default nccl timeout, as its C++ header declares it: every torch wheel ships its headers,
    a CPU build too, whose Python has no nccl constant (torch.distributed.constants says None)."""
    header = Path(torch.__file__).parent / "include/torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp"
    declared = re.search(
        r"kProcessGroupNCCLDefaultTimeout =\s*std::chrono::milliseconds\(([\d *]+)\);", header.read_text()
    )
    assert declared, f"{header} no longer declares kProcessGroupNCCLDefaultTimeout as it did in torch 2.13"
    return timedelta(milliseconds=math.prod(int(factor) for factor in declared.group(1).split("*")))


def test_the_nccl_timeout_row_gives_torchs_default():
    default = nccl_default()
    if torch.distributed.constants.default_pg_nccl_timeout is not None:  # a build with nccl says it too
        assert torch.distributed.constants.default_pg_nccl_timeout == default
    after, message = timeout_row("nccl")
    assert after == default, "the row's minutes are not torch's default"
    assert f"Timeout(ms)={int(default.total_seconds() * 1000)}" in message
