"""The plumbing of walkthrough.ipynb, kept out of the lesson's way: run a command as a terminal would,
show one DDP step's lines of train_ddp.py, read and plot what the runs wrote, plot what a rank holds
in benchmarks/memory.py's kept run, measure throughput, (with traces.py) read and draw the traces
that --profile writes, and draw figures/ddp.png, the picture the README and the notebook open with:

    python walkthrough_helpers.py      # redraws figures/ddp.png

What is taught stays in train_ddp.py and in the notebook; nothing here is part of DDP.
"""

import ast
import difflib
import itertools
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import FancyBboxPatch
from torch.utils.data.distributed import DistributedSampler

# the traces --profile writes, read and drawn: traces.py (the notebook, benchmarks/buckets.py and the
# tests share it); the notebook takes them from here, with the rest of its plumbing
from traces import communication, draw_timelines, print_communication, read_traces  # noqa: F401

STARTED = time.perf_counter()
OUT = Path("out/walkthrough")  # everything the notebook writes goes here (git ignores out/), made by fresh()
FIGURES = Path(os.environ.get("WALKTHROUGH_FIGURES", OUT))  # WALKTHROUGH_FIGURES=figures: the README's


# -----------------------------------------------------------------------------
# running the scripts


def shown(command, env=None, cwd=None):
    """Run command, its output (stdout and stderr) shown as it comes; its exit status."""
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd
    ) as proc:
        for line in proc.stdout:
            print(line, end="", flush=True)
    return proc.returncode


def run(*args, nproc=None):
    """`python ARGS`, or `torchrun --standalone --nproc_per_node=NPROC ARGS`, its output shown as it
    comes. A command that fails fails the cell, as it would stop a shell script (a notebook's
    `!torchrun ...` would pass silently). Every process gets one thread (see "How fast")."""
    launcher = [] if nproc is None else ["--standalone", f"--nproc_per_node={nproc}"]
    print("$", "torchrun" if launcher else "python", *launcher, *args, flush=True)
    torchrun = ["-m", "torch.distributed.run"] if launcher else []  # torchrun, with this kernel's Python
    status = shown([sys.executable, *torchrun, *launcher, *args], env=dict(os.environ, OMP_NUM_THREADS="1"))
    if status:
        raise RuntimeError(f"exited with {status}: {' '.join(args)}")


def check(script, *args, expect=None, cwd=None):
    """`python check_ddp.py SCRIPT ARGS`, its report shown as it comes; in cwd, if given, as from a
    terminal there (`cd CWD`). It exits 1 when a step fails, as a broken conversion should: the
    cell fails unless it exits as expected (expect=None: 0 or 1, a verdict either way; 2 or 3, a
    usage error or the check's own, fail it always)."""
    tool = os.path.relpath("check_ddp.py", cwd or ".")
    command = " ".join(["python", tool, str(script), *map(str, args)])
    print(f"$ cd {cwd}\n$ {command}" if cwd else f"$ {command}", flush=True)
    status = shown([sys.executable, tool, str(script), *map(str, args)], cwd=cwd)
    allowed = (0, 1) if expect is None else (expect,)
    if status not in allowed:
        raise RuntimeError(f"check_ddp.py exited with {status}, not {' or '.join(map(str, allowed))}")


def fresh(name):
    """OUT/name, emptied: each run its own folder (the scripts never mix two runs' files). The first
    call makes OUT and FIGURES: importing this file makes nothing."""
    for folder in (OUT, FIGURES):
        folder.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(OUT / name, ignore_errors=True)
    return OUT / name


def metrics(out_dir):
    """The records of metrics.jsonl, one per epoch."""
    return [json.loads(line) for line in (Path(out_dir) / "metrics.jsonl").read_text().splitlines()]


def process_counts():
    """The process counts to run: WALKTHROUGH_NPROCS=1,2 if set, else the GPUs (1, 2, 4, 8 that fit),
    else 1, 2 and 4 on the CPU."""
    if "WALKTHROUGH_NPROCS" in os.environ:
        return [int(n) for n in os.environ["WALKTHROUGH_NPROCS"].split(",")]
    if torch.cuda.is_available():
        return [n for n in (1, 2, 4, 8) if n <= torch.cuda.device_count()]
    return [1, 2, 4]


def rounds():
    """How many interleaved rounds the scaling measurement runs: WALKTHROUGH_ROUNDS if set (1: a quick
    pass, as the tests make), else 2, which keeps the notebook's run within its three minutes."""
    return int(os.environ.get("WALKTHROUGH_ROUNDS", 2))


def hardware():
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name()}, nccl"
    return f"{os.cpu_count()}-core {platform.machine()} CPU, gloo"


def cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


# -----------------------------------------------------------------------------
# show_step(n): the lines of train_ddp.py that make DDP step n


def show_step(n, script="train_ddp.py", twin="single_gpu_baseline.py"):
    """Print the lines of train_ddp.py that make DDP step n, with their line numbers; `...` marks the
    lines left out. Which lines, each found from a `DDP step n` tag:
    - a comment that opens with the tag: the comment, and the lines under it that the twin diff
      changes, down to a blank line, the end of the block, or another step's tag;
    - a function whose docstring opens with the tag: the whole function;
    - the module docstring: the tagged paragraph, and the commands indented under it;
    - any other tagged line: that line.
    Above each group of lines shown: the line that opens their block, or that assigns a name they use."""
    code = Path(script).read_text().splitlines()
    shown = sorted(step_lines(n, code, Path(twin).read_text().splitlines()))
    for k, i in enumerate(shown):
        if k and i > shown[k - 1] + 1:
            print("     ...")
        print(f"{i + 1:4}  {code[i]}")


def step_lines(n, code, twin):
    """The indices of the lines show_step(n) prints, by the rules in its docstring."""
    changed = set()
    for op, _, _, start, end in difflib.SequenceMatcher(None, twin, code, autojunk=False).get_opcodes():
        if op != "equal":
            changed.update(range(start, end))
    tag, other = re.compile(rf"DDP step {n}\b"), re.compile(rf"DDP step (?!{n}\b)\d+\b")
    docstring_end = ast.parse("\n".join(code)).body[0].end_lineno  # the module's docstring
    shown = set()
    for i, line in enumerate(code):
        if not tag.search(line):
            continue
        if i < docstring_end:
            shown.update(paragraph(code, i))
        elif line.strip().startswith('"""'):
            shown.update(function(code, i - 1))
        elif re.match(rf"\s*# DDP step {n}\b", line):
            shown.update(block(code, i, changed, other))
        else:
            shown.add(i)
    for first in [i for i in sorted(shown) if i - 1 not in shown]:  # the first line of each group
        group = itertools.takewhile(lambda j: j in shown, range(first, len(code)))
        used = set(re.findall(r"\w+", " ".join(code[j].split("#")[0] for j in group)))
        above = code[first - 1]
        if opens_block(above, code[first]) or assigned(above) & used:
            shown.add(first - 1)
    return shown


def indent(line):
    return len(line) - len(line.lstrip())


def block(code, i, changed, other):
    """The comment at line i, and the changed lines under it, down to a blank line, the end of the
    block, or another step's tag."""
    lines = [i]
    for j in range(i + 1, len(code)):
        if not code[j].strip() or indent(code[j]) < indent(code[i]) or other.search(code[j]):
            break
        if j in changed:
            lines.append(j)
    return lines


def function(code, start):
    """The function whose def is at line start, without the blank lines after it."""
    end = start + 1
    while end < len(code) and (not code[end].strip() or indent(code[end]) > indent(code[start])):
        end += 1
    while not code[end - 1].strip():
        end -= 1
    return range(start, end)


def paragraph(code, i):
    """Line i down to the first blank line followed by an unindented one: a paragraph of prose, and
    the commands indented under it."""
    end = i + 1
    while end + 1 < len(code) and (code[end].strip() or code[end + 1].startswith(" ")):
        end += 1
    return range(i, end)


def opens_block(above, line):
    """Whether the code line above opens the block that line is in (a def, a for, an except...)."""
    return above.strip() and not above.lstrip().startswith("#") and indent(above) < indent(line)


def assigned(line):
    """The names a line assigns (`a, b = ...`), if it is a whole assignment."""
    try:
        statement = ast.parse(line.strip()).body[0]
    except (SyntaxError, IndexError):
        return set()
    if not isinstance(statement, ast.Assign):
        return set()
    return {
        node.id for target in statement.targets for node in ast.walk(target) if isinstance(node, ast.Name)
    }


# -----------------------------------------------------------------------------
# plots and measurements


def largest_gap(a, b, key):
    """The largest per-epoch difference of metrics[key] between two runs."""
    return max(abs(x[key] - y[key]) for x, y in zip(metrics(a), metrics(b), strict=True))


def plot_losses(baseline, runs, keys, title):
    """Per-epoch loss (keys: "loss", "val_loss") of baseline, (label, out_dir), as a wide grey line, and of
    runs, {label: out_dir}, each dashed on top of it."""
    names = {"loss": "training loss", "val_loss": "held-out loss (DDP step 10)"}
    epochs = [r["epoch"] for r in metrics(baseline[1])]
    fig, axes = plt.subplots(1, len(keys), figsize=(5.5 * len(keys), 4), sharey=True, squeeze=False)
    for ax, key in zip(axes[0], keys, strict=True):
        ax.plot(epochs, [r[key] for r in metrics(baseline[1])], color="0.6", lw=6, label=baseline[0])
        for label, out_dir in runs.items():
            ax.plot(epochs, [r[key] for r in metrics(out_dir)], "o--", label=label)
        ax.set(xlabel="epoch", ylabel=f"{names[key]} (MSE)", yscale="log", xticks=epochs, title=names[key])
        ax.tick_params(labelleft=True, which="both")  # one scale, read on every panel
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def plot_memory(kept):
    """What a rank holds in a kept run of benchmarks/memory.py (the JSON file kept): for each of its two
    models, the peak of a training step for DDP and FSDP2 (as train_fsdp.py shards it) at each N, and
    FSDP2's parameters, gradients and optimizer state (what it holds at its step, the rest all
    transient), on the rank that measured the most; bars
    of MiB, then a line per model and N and where the figures come from. Nothing is measured here: the
    file is read."""
    record = json.loads(Path(kept).read_text())

    def most(model, case, n, key):
        (found,) = [c for c in record["cases"] if (c["model"], c["case"], c["nproc"]) == (model, case, n)]
        return max(rank[key] for rank in found["ranks"]) / 2**20

    counts = sorted({c["nproc"] for c in record["cases"]})
    fig, axes = plt.subplots(1, len(record["models"]), figsize=(11, 3.8))
    for ax, model in zip(axes, record["models"], strict=True):
        bars = [("DDP", "peak", "0.6"), ("FSDP2", "peak", "tab:purple"), ("FSDP2", "held", "thistle")]
        for i, (case, key, color) in enumerate(bars):
            x = [k + (i - 1) * 0.27 for k in range(len(counts))]
            mib = [most(model, case, n, key) for n in counts]
            label = f"{case}, {'peak of a step' if key == 'peak' else 'parameters, gradients, momentum'}"
            ax.bar(x, mib, 0.25, color=color, label=label)
            for xi, m in zip(x, mib, strict=True):
                ax.text(xi, m, f"{m:.1f}", ha="center", va="bottom", fontsize=7)
        top = max(most(model, "DDP", n, "peak") for n in counts)
        ax.set(xticks=range(len(counts)), xticklabels=[f"N={n}" for n in counts], ylim=(0, 1.45 * top))
        ax.set(ylabel="MiB a rank", title=f"{model}: {record['models'][model]}")
        ax.title.set_fontsize(8)
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle(f"benchmarks/memory.py, kept {record['date']}", fontsize=10)
    fig.tight_layout()
    print(f"the kept run of benchmarks/memory.py, {record['date']}: {record['label']}")
    for model in record["models"]:
        for n in counts:
            ddp, fsdp = most(model, "DDP", n, "peak"), most(model, "FSDP2", n, "peak")
            held = most(model, "FSDP2", n, "held")
            print(
                f"{model}, N={n}: peak DDP {ddp:.2f} MiB a rank, FSDP2 {fsdp:.2f} MiB: {fsdp / ddp:.2f}x "
                f"DDP's; FSDP2's parameters, gradients and momentum {held:.2f} MiB"
            )
    return fig


def measure(regimes, counts, rounds):
    """Throughput of train_ddp.py, {(regime, N): [samples/s, one per round]}: each case once a round, the
    rounds interleaved; one process runs as plain `python`, without torchrun's start-up (not counted
    anyway). Each number is the median of the epochs after the first, as the loop's own clock measured."""
    speed = {}
    for k in range(rounds):
        for regime, flags in regimes.items():
            for n in counts:
                out = fresh(f"{regime}{n}-round{k}")
                run("train_ddp.py", *flags, "--epochs=3", f"--out_dir={out}", nproc=n if n > 1 else None)
                epochs = [r["samples_per_sec"] for r in metrics(out)[1:]]
                speed.setdefault((regime, n), []).append(statistics.median(epochs))
    return speed


def plot_scaling(speed, regimes, counts, title):
    """Plot 2: each regime's throughput against ideal scaling, then the efficiency of both; then a line
    per case: the median (min to max) over the rounds, each round's efficiency against the same round's
    fewest processes."""
    one = counts[0]
    efficiency = {
        (regime, n): [s / (s1 * n / one) for s, s1 in zip(speed[regime, n], speed[regime, one], strict=True)]
        for regime, n in speed
    }
    fig, axes = plt.subplots(1, len(regimes) + 1, figsize=(5 * (len(regimes) + 1), 4))
    for i, (ax, regime) in enumerate(zip(axes[:-1], regimes, strict=True)):
        mid, spread = bars([speed[regime, n] for n in counts])
        ax.errorbar(
            counts, mid, spread, fmt="o-", color=f"C{i}", capsize=4, label="measured: median, min to max"
        )
        ax.plot(counts, [mid[0] * n / one for n in counts], ":", color="0.4", label="ideal: N x one process")
        ax.set(
            xlabel="processes",
            ylabel="samples / s",
            xticks=counts,
            ylim=(0, None),
            title=f"{regime}: throughput",
        )
        ax.yaxis.set_major_formatter("{x:,.0f}")
        ax.legend()
    for regime in regimes:
        mid, spread = bars([efficiency[regime, n] for n in counts])
        axes[-1].errorbar(counts, mid, spread, fmt="o-", capsize=4, label=regime)
    axes[-1].axhline(1, color="0.4", ls=":")
    top = max(max(v) for v in efficiency.values())
    axes[-1].set(
        xlabel="processes", ylabel="efficiency (1 = ideal)", xticks=counts, ylim=(0, max(1.2, top + 0.1))
    )
    axes[-1].set_title("scaling efficiency")
    axes[-1].legend()
    fig.suptitle(title)
    fig.tight_layout()
    for (regime, n), values in speed.items():
        e = efficiency[regime, n]
        throughput = f"{regime:5}  N={n}:  {summary(values, ',.0f')} samples/s"
        print(f"{throughput}   efficiency {summary(e, '.2f')}{above_one(e)}")
    return fig


def bars(values):
    """Medians, and their distances to the min and the max, for matplotlib's errorbar."""
    mid = [statistics.median(v) for v in values]
    return mid, [
        [m - min(v) for m, v in zip(mid, values, strict=True)],
        [max(v) - m for m, v in zip(mid, values, strict=True)],
    ]


def summary(values, spec):
    return f"{statistics.median(values):{spec}} ({min(values):{spec}} to {max(values):{spec}})"


def above_one(e):
    """An efficiency above 1 is not a result: say what it is."""
    if statistics.median(e) <= 1:
        return ""
    return (
        "  above 1: within noise" if min(e) <= 1 else "  above 1 in every round: a busy machine? run it again"
    )


# -----------------------------------------------------------------------------
# figures/ddp.png


def draw_ddp():
    """What DDP does, with the shards that DistributedSampler really deals 3 ranks from 12 samples in
    the first epoch."""
    ranks, samples = 3, 12
    shards = [
        list(DistributedSampler(range(samples), num_replicas=ranks, rank=r, seed=0)) for r in range(ranks)
    ]
    owner = {i: r for r, shard in enumerate(shards) for i in shard}
    color = plt.cm.tab10.colors
    fig, ax = plt.subplots(figsize=(11, 5.6))
    ax.set(xlim=(0, 12), ylim=(0.2, 10))
    ax.axis("off")
    ax.text(
        6,
        9.7,
        "the dataset, the same on every rank; a sample's colour is the rank whose shard holds it",
        ha="center",
    )
    for i in range(samples):
        ax.add_patch(plt.Rectangle((i + 0.05, 8.4), 0.9, 0.9, color=color[owner[i]]))
        ax.text(i + 0.5, 8.85, str(i), ha="center", va="center", color="white", weight="bold")
    for r, shard in enumerate(shards):
        x = 4 * r + 2  # the middle of rank r's column
        ax.annotate("", (x, 7.2), (x, 8.3), arrowprops={"arrowstyle": "->", "color": color[r], "lw": 2})
        box = FancyBboxPatch(
            (x - 1.7, 4.6), 3.4, 2.5, boxstyle="round,pad=0.1", fc="white", ec=color[r], lw=2
        )
        ax.add_patch(box)
        ax.text(x, 6.65, f"rank {r}: process {r}, device {r}", ha="center", weight="bold")
        ax.text(x, 5.8, "a replica of the model,\nthe same weights on every rank", ha="center", va="center")
        ax.text(x, 4.95, f"trains on its shard {shard}", ha="center")
        ax.annotate("", (x, 3.3), (x, 4.5), arrowprops={"arrowstyle": "<->", "lw": 1.5})
        ax.text(x + 0.1, 3.9, f"gradients $g_{r}$", va="center")
    ax.add_patch(FancyBboxPatch((0.3, 2.1), 11.4, 1.1, boxstyle="round,pad=0.1", fc="0.93", ec="0.4"))
    mean = " + ".join(f"g_{r}" for r in range(ranks))
    ax.text(
        6,
        2.65,
        "during backward(): all-reduce, bucket by bucket; every rank gets the mean, "
        f"$({mean})\\,/\\,{ranks}$",
        ha="center",
        va="center",
    )
    ax.text(
        6,
        1.2,
        "then optimizer.step() on every rank, with the same gradient: the replicas stay identical",
        ha="center",
    )
    ax.set_title(f"DDP with {ranks} processes", weight="bold")
    return fig


if __name__ == "__main__":
    path = Path(__file__).parent / "figures" / "ddp.png"
    # no version stamp in the file: its bytes change only when the drawing does
    draw_ddp().savefig(path, dpi=100, bbox_inches="tight", metadata={"Software": None})
    print(f"wrote {path}")
