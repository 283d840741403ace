"""What `--profile` recorded, read and drawn: each rank's trace (forward, backward, DDP's wait and the
optimizer step on the main thread; each bucket's all-reduce on the thread or CUDA stream that ran it,
and with train_fsdp.py, FSDP2's all-gathers and reduce-scatters there), the share of all-reduce time
hidden under backward, and the timeline (figures/timeline.png): DDP's and FSDP2's side by side with
draw_timelines({"DDP": read_traces(a), "FSDP2": read_traces(b)}, title).

    from traces import read_traces, communication, draw_timelines

The notebook, benchmarks/buckets.py and tests/test_traces.py read traces through it. Importing it does
nothing but define what it defines: no folder is made, nothing is written.
"""

import itertools
import json
import math
import re
from pathlib import Path

import matplotlib.pyplot as plt

# the all-reduces of DDP's buckets, as each backend records them: gloo's on gloo's own threads (the
# main thread records only the call that hands a bucket over, c10d::allreduce_), nccl's as kernels
# on a CUDA stream of their own
ALL_REDUCE = re.compile(r"gloo:all_reduce|nccl\w*all_?reduce", re.IGNORECASE)
# FSDP2's exchanges (train_fsdp.py): nccl's kernels say which they are; gloo runs a reduce-scatter as
# an all-reduce of the whole tensor and records it as one (gloo:all_reduce), so a gloo thread's
# exchange is named by the call that handed it over on the main thread, the n-th call the n-th
# exchange, in the order gloo takes them
NCCL = {
    "all-gather": re.compile(r"nccl\w*all_?gather", re.IGNORECASE),
    "reduce-scatter": re.compile(r"nccl\w*reduce_?scatter", re.IGNORECASE),
    "all-reduce": ALL_REDUCE,
}
GLOO = re.compile(r"gloo:\w+")
HANDED_OVER = {
    "c10d::allreduce_": "all-reduce",
    "c10d::_allgather_base_": "all-gather",
    "c10d::_reduce_scatter_base_": "reduce-scatter",
}
EXCHANGES = ("all-reduce", "all-gather", "reduce-scatter")
WAIT = "backward: DDP waits for the all-reduces"
COLOURS = {
    "forward": "tab:blue",
    "backward": "tab:orange",
    WAIT: "navajowhite",
    "optimizer step": "tab:green",
    "all-reduce": "tab:red",
    "all-gather": "tab:purple",
    "reduce-scatter": "tab:brown",
    "GPU compute": "0.65",
}


def read_trace(path):
    """One process's trace, as --profile wrote it, as a dict; times in ms, on the clock that the
    processes of one machine share.
    - rank: the process's rank (0 for the baseline);
    - steps: the (start, end) of each recorded step on the main thread, the one that runs the loop;
      and numbers: each one's number in its epoch, from 1;
    - phases: (phase, start, end) on the main thread, step by step: forward (the batch's copy to the
      device, the model, the loss), backward (autograd computing the gradients; DDP's hooks hand each
      bucket to the backend as it fills), then, with DDP, WAIT: what is left of backward() once the
      gradients are computed, DDP waiting for the all-reduces and copying each bucket's mean back;
      and the optimizer step, zero_grad included;
    - rows: {name: [(what, start, end, label)]}, a row for each other thread, or CUDA stream, that
      ran an exchange or a kernel: what is "all-reduce" (DDP's, labelled with its bucket, the order
      in which its step handed them over), "all-gather" or "reduce-scatter" (FSDP2's, numbered in
      their step, each kind apart), or "GPU compute". On a GPU, the phases are what the CPU did,
      launching kernels, and the streams' rows what the GPU did, later."""
    trace = json.loads(Path(path).read_text())
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X" and "dur" in e]
    steps = sorted(  # on the CPU: on a GPU, a copy of each spans its kernels
        (
            e
            for e in events
            if e["name"].startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"
        ),
        key=lambda e: e["ts"],
    )
    main = (steps[0]["pid"], steps[0]["tid"])
    # gloo's exchanges, each named by the main thread's call that handed it over (in order, one each)
    calls = sorted((e for e in events if e["name"] in HANDED_OVER), key=lambda e: e["ts"])
    gloos = sorted((e for e in events if GLOO.match(e["name"])), key=lambda e: e["ts"])
    kinds = (
        {id(g): HANDED_OVER[c["name"]] for c, g in zip(calls, gloos, strict=True)}
        if len(calls) == len(gloos)
        else {id(g): "all-reduce" for g in gloos if ALL_REDUCE.search(g["name"])}  # DDP's alone
    )

    def span(chosen):
        return min(e["ts"] for e in chosen) / 1e3, max(e["ts"] + e["dur"] for e in chosen) / 1e3

    phases, rows = [], {}
    for step in steps:
        start, end = step["ts"], step["ts"] + step["dur"]
        inside = [e for e in events if e is not step and start <= e["ts"] < end]
        # the process's threads: on a GPU, autograd runs backward on a thread of its own
        ours = [e for e in inside if e["pid"] == main[0]]

        def named(*prefixes, ours=ours):
            return [e for e in ours if e["name"].startswith(prefixes)]

        backward = named("autograd::engine::evaluate_function")
        if not backward:
            continue  # not a step of the loop
        fetched = max((e["ts"] + e["dur"] for e in named("enumerate(DataLoader)")), default=start)
        forward = [e for e in ours if e["tid"] == main[1] and fetched <= e["ts"] < backward[0]["ts"]]
        phases.append(("forward", *span(forward)))
        phases.append(("backward", *span(backward)))
        copies = named("torch.distributed.ddp.reducer::copy_bucket_to_grad")
        if copies:
            phases.append((WAIT, span(backward)[1], span(copies)[1]))
        # DDP copies the last bucket's mean back only once every all-reduce of the step is done. gloo
        # records an all-reduce's end after it has woken the waiting thread (ProcessGroupGloo's
        # finishWorkGloo: the future first, then the profiler's record), so on a busy CPU its end can
        # come later than that: it is cut there
        done = max(e["ts"] for e in copies) / 1e3 if copies else math.inf
        if named("Optimizer.step"):  # not after a micro-batch that only accumulates (DDP step 9)
            phases.append(("optimizer step", *span(named("Optimizer.step", "Optimizer.zero_grad"))))
        numbers = {what: itertools.count() for what in EXCHANGES}  # buckets, for DDP's all-reduces
        for e in sorted(inside, key=lambda e: e["ts"]):
            if (e["pid"], e["tid"]) == main:
                continue
            gpu = e.get("cat") == "kernel"
            what = kinds.get(id(e)) or next((k for k, name in NCCL.items() if name.search(e["name"])), None)
            if what:
                label = str(next(numbers[what]))
            elif gpu:
                what, label = "GPU compute", ""
            else:
                continue
            began, ended = e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3
            ended = ended if gpu else max(began, min(ended, done))
            rows.setdefault((gpu, e["tid"]), []).append((what, began, ended, label))
    threads = itertools.count(1)  # named in the order they first ran something: gloo has 2 by default
    rows = {
        f"GPU stream {tid}" if gpu else f"gloo thread {next(threads)}": row
        for (gpu, tid), row in rows.items()
    }
    return {
        "rank": trace.get("distributedInfo", {}).get("rank", 0),
        "steps": [(s["ts"] / 1e3, (s["ts"] + s["dur"]) / 1e3) for s in steps],
        "numbers": [int(s["name"].partition("#")[2]) + 1 for s in steps],  # ProfilerStep#0: the first
        "phases": phases,
        "rows": rows,
    }


def read_traces(out_dir):
    """The traces that a run's processes wrote into out_dir, in rank order; a folder with none is a
    mistake said plainly (a run without --profile, or another run's folder), not an empty picture."""
    found = sorted(map(read_trace, Path(out_dir).glob("trace_rank*.json")), key=lambda trace: trace["rank"])
    if not found:
        raise FileNotFoundError(
            f"{out_dir} holds no trace_rank*.json: run with --profile into that --out_dir"
        )
    return found


def union(intervals):
    """The (start, end) intervals, merged where they overlap."""
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def overlap(a, b):
    """How long the intervals of a and those of b run at the same time."""
    return sum(max(0, min(x[1], y[1]) - max(x[0], y[0])) for x in union(a) for y in union(b))


def exchanges(trace, kind="all-reduce"):
    """The (start, end) of each exchange of a kind in the trace: all-reduce (DDP's gradient buckets),
    all-gather or reduce-scatter (FSDP2's)."""
    return [(s, e) for row in trace["rows"].values() for what, s, e, _ in row if what == kind]


def all_reduces(trace):
    """The (start, end) of each all-reduce in the trace."""
    return exchanges(trace, "all-reduce")


def computing(trace):
    """What an all-reduce can hide under: on a CPU, the backward passes, in which the main thread
    computes the gradients itself; on a GPU, the compute kernels (the CPU only launches them)."""
    kernels = [(s, e) for row in trace["rows"].values() for what, s, e, _ in row if what == "GPU compute"]
    return kernels or [(s, e) for phase, s, e in trace["phases"] if phase == "backward"]


def communication(trace):
    """What a trace's all-reduces were: counts, their time, and the share of it hidden under compute;
    and how many all-gathers and reduce-scatters (FSDP2's) it holds."""
    reduces = all_reduces(trace)
    busy = overlap(reduces, reduces)  # the time during which at least one all-reduce runs
    return {
        "backward passes": sum(phase == "backward" for phase, _, _ in trace["phases"]),
        "optimizer steps": sum(phase == "optimizer step" for phase, _, _ in trace["phases"]),
        "all-reduces": len(reduces),
        "all-reduce ms": busy,
        "hidden": overlap(reduces, computing(trace)) / busy if busy else None,
        "all-gathers": len(exchanges(trace, "all-gather")),
        "reduce-scatters": len(exchanges(trace, "reduce-scatter")),
    }


def print_communication(runs):
    """For each run, {title: its traces}, a line per rank: its recorded steps' backward passes,
    optimizer steps and all-reduces, and the share of the all-reduces' time hidden under backward
    (on a GPU, under the compute kernels)."""
    for title, traces in runs.items():
        print(title)
        for trace in traces:
            c = communication(trace)
            line = (
                f"  rank {trace['rank']}: {c['backward passes']} backward passes, "
                f"{c['optimizer steps']} optimizer steps, {c['all-reduces']} all-reduces"
            )
            if c["hidden"] is not None:
                line += f" in {c['all-reduce ms']:.1f} ms, {c['hidden']:.0%} of it hidden under backward"
            if c["all-gathers"] or c["reduce-scatters"]:  # FSDP2's
                line += f", {c['all-gathers']} all-gathers, {c['reduce-scatters']} reduce-scatters"
            print(line)


def draw_timelines(runs, title, steps=2):
    """A panel per run, {title: its traces, one per rank}, stacked on one time scale: its first `steps`
    recorded steps. A row for each rank's main thread (forward, backward, DDP's wait for the
    all-reduces, the optimizer step) and one for each thread or CUDA stream where its exchanges ran:
    DDP's all-reduces, each numbered by its bucket (0, the first handed over, holds the last layer's
    gradients); FSDP2's all-gathers and reduce-scatters, each numbered in its step. DDP's run and
    FSDP2's, two panels of one figure, show one's buckets beside the other's exchanges."""
    windows = {  # each panel's time: from the first of its steps on any rank to the last on any
        panel: (
            min(trace["steps"][0][0] for trace in traces),
            max(trace["steps"][steps - 1][1] for trace in traces),
        )
        for panel, traces in runs.items()
    }
    widest = max(end - start for start, end in windows.values())
    heights = [sum(1 + len(trace["rows"]) for trace in traces) + 1 for traces in runs.values()]
    fig, axes = plt.subplots(
        len(runs), 1, figsize=(13, 1 + 0.36 * sum(heights)), gridspec_kw={"height_ratios": heights}
    )
    axes = [axes] if len(runs) == 1 else list(axes)
    drawn = set()
    for ax, (panel, traces) in zip(axes, runs.items(), strict=True):
        t0 = windows[panel][0]
        labels = []
        for trace in traces:
            end = trace["steps"][steps - 1][1]
            bars = {f"rank {trace['rank']}, main thread": [(p, s, e, "") for p, s, e in trace["phases"]]}
            bars.update({f"rank {trace['rank']}, {name}": row for name, row in trace["rows"].items()})
            for label, row in bars.items():
                y = -len(labels)
                labels.append(label)
                for what, s, e, text in row:
                    if s >= end:
                        continue
                    drawn.add(what)
                    ax.broken_barh([(s - t0, e - s)], (y - 0.4, 0.8), color=COLOURS[what], ec="white", lw=0.5)
                    if text and e - s > widest / 80:  # a bucket's number, where it fits
                        ax.text(
                            (s + e) / 2 - t0, y, text, ha="center", va="center", color="white", fontsize=8
                        )
        for (s, e), number in list(zip(traces[0]["steps"], traces[0]["numbers"], strict=True))[:steps]:
            ax.axvline(s - t0, color="0.3", lw=0.8, ls=":")  # where rank 0's batches begin
            name = f"batch {number}" if e - s > widest / 25 else str(number)
            ax.text(s - t0, 0.55, f" {name}", va="bottom", fontsize=8, color="0.3")
        ax.set_yticks(range(0, -len(labels), -1), labels)
        ax.set(xlim=(0, widest * 1.01), ylim=(-len(labels) + 0.4, 1.3))
        ax.set_title(panel, loc="left", fontsize=10)
    axes[-1].set_xlabel("ms since the first of these batches began, on any rank")
    shown = [what for what in COLOURS if what in drawn]
    handles = [plt.Rectangle((0, 0), 1, 1, color=COLOURS[what]) for what in shown]
    inch = 1 / fig.get_figheight()  # the title, then the legend, above the panels
    fig.suptitle(title, y=1 - 0.1 * inch, va="top")
    fig.legend(handles, shown, loc="upper center", bbox_to_anchor=(0.5, 1 - 0.35 * inch), ncol=len(shown))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.65 * inch))
    return fig
