"""--profile: every process writes a trace of a few batches, the trace shows DDP's all-reduces running
while backward still computes, the notebook's drawing code reads it, and it changes nothing else."""

import json
import re
import sys

import pytest
import torch
from helpers import ROOT, load_checkpoint, max_weight_diff, read_metrics, run
from test_twins import default_run

# the wide model at batch 256 a process: 8 batches an epoch on each of 2 ranks, so that batches 3 to 6
# of the second are recorded; the middle layer's backward is long enough for gloo to start under it
TRACED = "--epochs 2 --hidden_size 512 --batch_size 256 --dataset_size 4096"
TORCHRUN_2 = "torchrun --standalone --nproc_per_node=2"
# --bucket_cap_mb 0.001: 1 KiB buckets, so that the last layer's gradients are all-reduced alone,
# while the middle layer's are computed (torch's default makes 2 buckets of this model, the first
# only once the middle layer's gradients are done)
SMALL_BUCKETS = f"{TORCHRUN_2} train_ddp.py {TRACED} --profile --bucket_cap_mb 0.001 --out_dir traced"
ACCUMULATING = f"{SMALL_BUCKETS} --grad_accum_steps 2"
BASELINE = f"python single_gpu_baseline.py {TRACED} --profile --out_dir traced"
UNPROFILED = f"{TORCHRUN_2} train_ddp.py {TRACED} --out_dir plain"  # torch's buckets, no --profile
TRAIN_DDP = ROOT / "train_ddp.py"
# train_fsdp.py, profiled as train_ddp.py is (torch's buckets have no FSDP2 counterpart to set)
FSDP = f"{TORCHRUN_2} train_fsdp.py {TRACED} --profile --out_dir traced"
FSDP_ACCUMULATING = f"{FSDP} --grad_accum_steps 2"
# the Linear layers train_fsdp.py shards: each all-gathers in forward and in backward, reduce-scatters once
BLOCKS = 3


@pytest.fixture(scope="module")
def drawing():
    """traces.py, which the notebook, the benchmark and these tests read traces with."""
    import traces

    return traces


def test_importing_the_notebooks_plumbing_makes_nothing(tmp_path):
    """walkthrough_helpers (and traces, which it imports) define what they define; folders are made
    when something is written, by the notebook's first run."""
    code = "import sys; sys.path.insert(0, sys.argv[1]); import walkthrough_helpers, traces"
    run([sys.executable, "-c", code, str(ROOT)], cwd=tmp_path)
    assert not list(tmp_path.iterdir())


def traces(run, drawing):
    """A run's traces, one per rank, as the notebook reads them; and what each file is. A run that
    wrote none fails here: a test that compares no traces would pass on nothing."""
    files = sorted(run.out.glob("trace*.json"))
    assert files, f"no trace written in {run.out}:\n{run.proc.stdout}"
    for rank, path in enumerate(files):  # Chrome's trace format, which Perfetto opens
        assert path.name == f"trace_rank{rank}.json", files
        assert isinstance(json.loads(path.read_text())["traceEvents"], list)
    return drawing.read_traces(run.out)


@pytest.mark.slow
def test_every_rank_writes_a_trace_whose_all_reduces_overlap_backward(shared_run, drawing):
    traced = shared_run(SMALL_BUCKETS)
    said = [line for line in traced.proc.stdout.splitlines() if "--profile" in line]
    assert said == [  # rank 0 alone says where, once
        "train_ddp.py: --profile: batches 3 to 6 of this epoch, a trace per process: traced/trace_rank*.json "
        "(open one in ui.perfetto.dev)"
    ], traced.proc.stdout
    ranks = traces(traced, drawing)
    assert [trace["rank"] for trace in ranks] == [0, 1]
    for trace in ranks:
        assert trace["numbers"] == [3, 4, 5, 6], trace["numbers"]
        backward = [(s, e) for phase, s, e in trace["phases"] if phase == "backward"]
        reduces = drawing.all_reduces(trace)
        assert len(backward) == 4 and reduces, trace
        # --bucket_cap_mb reached DDP: at most 2 of the model's 6 tensors a bucket, so 3 buckets or
        # more a step, where torch's default makes 2
        assert len(reduces) >= 3 * 4, len(reduces)
        under = [r for r in reduces if drawing.overlap([r], backward) > 0]
        assert under, f"rank {trace['rank']}: no all-reduce ran while backward computed: {reduces} {backward}"


@pytest.mark.slow
def test_the_profilers_own_lines_stay_out_of_the_scripts_output(shared_run):
    # torch 2.13's profiler prints "USDT:... profiler_start" and "profiler_stop" on every process that
    # records; each script's --profile keeps them out (KINETO_LOG_LEVEL), so that a run prints its own
    for command in (SMALL_BUCKETS, BASELINE, FSDP):
        proc = shared_run(command).proc
        said = [line for line in (proc.stdout + proc.stderr).splitlines() if "profiler_st" in line]
        assert said == [], f"{command}:\n" + "\n".join(said)


@pytest.mark.slow
def test_the_notebooks_drawing_code_draws_them(shared_run, drawing):
    runs = {
        title: traces(shared_run(command), drawing)
        for title, command in (("DDP", SMALL_BUCKETS), ("K=2", ACCUMULATING), ("baseline", BASELINE))
    }
    figure = drawing.draw_timelines(runs, title="a test")
    panels = [ax for ax in figure.axes if ax.get_title(loc="left")]
    assert [ax.get_title(loc="left") for ax in panels] == list(runs)
    # a row per rank's main thread, and per gloo thread that ran an all-reduce
    rows = [len(ax.get_yticks()) for ax in panels]
    assert rows[0] >= 4 and rows[2] == 1, rows
    drawing.plt.close(figure)


@pytest.mark.slow
def test_the_baselines_trace_has_no_all_reduce(shared_run, drawing):
    (trace,) = traces(shared_run(BASELINE), drawing)
    assert trace["rank"] == 0 and trace["numbers"] == [3, 4, 5, 6]
    assert len([phase for phase, _, _ in trace["phases"] if phase == "backward"]) == 4
    assert drawing.all_reduces(trace) == [] and trace["rows"] == {}


@pytest.mark.slow
def test_no_sync_halves_the_all_reduces_of_the_same_backward_passes(shared_run, drawing):
    each, every_2 = (
        [drawing.communication(trace) for trace in traces(shared_run(command), drawing)]
        for command in (SMALL_BUCKETS, ACCUMULATING)
    )
    assert len(each) == len(every_2) == 2, "a trace from each of the 2 ranks of both runs"
    for k1, k2 in zip(each, every_2, strict=True):  # rank by rank
        assert k1["backward passes"] == k2["backward passes"] == 4
        assert k2["optimizer steps"] == k1["optimizer steps"] / 2 == 2
        # one round of buckets per optimizer step, with K micro-batches to a step as with 1
        assert k2["all-reduces"] == k1["all-reduces"] / 2 > 0, (k1, k2)


def test_a_run_without_profile_writes_no_trace(shared_run):
    ddp = default_run(shared_run, 2)  # the README's command, as test_twins makes it
    assert not [path for path in ddp.folder.rglob("*") if "trace" in path.name], list(ddp.folder.rglob("*"))
    assert "--profile" not in ddp.proc.stdout + ddp.proc.stderr


@pytest.mark.slow
def test_profiling_and_the_bucket_size_change_nothing_in_the_training(shared_run):
    # with torch's buckets and no profiler, and with 1 KiB buckets and the profiler: 2 ranks sum
    # each gradient alike, however they bucket it, so the weights are the same to the bit
    traced, plain = shared_run(SMALL_BUCKETS, UNPROFILED)
    assert not list(plain.out.glob("trace*"))
    for key in ("loss", "val_loss"):
        assert [r[key] for r in read_metrics(traced.out)] == [r[key] for r in read_metrics(plain.out)]
    a, b = (load_checkpoint(run.out / "model_epoch_2.pt")["model_state_dict"] for run in (traced, plain))
    assert all(a[name].equal(b[name]) for name in a), "the weights differ"


def test_the_default_bucket_size_train_ddp_states_is_torchs():
    stated = re.search(r"torch's default: (\d+) MiB, and (\d+) for the first bucket", TRAIN_DDP.read_text())
    assert stated, "train_ddp.py no longer states torch's default bucket size"
    assert int(stated[1]) == torch.nn.parallel.distributed._DEFAULT_BUCKET_CAP_MB
    assert int(stated[2]) * 2**20 == torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


# FSDP2 in time (train_fsdp.py) ------------------------------------------------------------------------


def steps_of(trace):
    """Each recorded step's (forward start, backward start, optimizer step start)."""
    starts = {phase: [s for p, s, _ in trace["phases"] if p == phase] for phase in ("forward", "backward")}
    steps = [s for p, s, _ in trace["phases"] if p == "optimizer step"]
    return list(zip(starts["forward"], starts["backward"], steps, strict=True))


@pytest.mark.slow
def test_fsdp_all_gathers_in_forward_and_backward_and_reduce_scatters_after_backward(shared_run, drawing):
    ranks = traces(shared_run(FSDP), drawing)
    assert [trace["rank"] for trace in ranks] == [0, 1]
    for trace in ranks:
        c = drawing.communication(trace)
        assert c["backward passes"] == c["optimizer steps"] == 4 and c["all-reduces"] == 0, c  # no bucket
        # each block's weights gathered before it computes, forward and backward; its gradients once
        assert c["all-gathers"] == 2 * BLOCKS * 4 and c["reduce-scatters"] == BLOCKS * 4, c
        steps = steps_of(trace)
        gathers, scatters = (drawing.exchanges(trace, kind) for kind in ("all-gather", "reduce-scatter"))
        in_forward = [g for g in gathers if any(f <= g[0] < b for f, b, _ in steps)]
        in_backward = [g for g in gathers if any(b <= g[0] < o for _, b, o in steps)]
        assert len(in_forward) == len(in_backward) == BLOCKS * 4, (in_forward, in_backward, steps)
        # a block's gradients are reduce-scattered once its backward is done, before the optimizer step
        assert all(any(b <= s[0] < o for _, b, o in steps) for s in scatters), (scatters, steps)


@pytest.mark.slow
def test_set_requires_gradient_sync_halves_the_reduce_scatters_of_the_same_backward_passes(
    shared_run, drawing
):
    # FSDP step 9 in time: with 2 micro-batches a step, one reduce-scatter a block a step, not one a
    # backward pass; every forward and backward still gathers the weights
    each, every_2 = (
        [drawing.communication(trace) for trace in traces(shared_run(command), drawing)]
        for command in (FSDP, FSDP_ACCUMULATING)
    )
    for k1, k2 in zip(each, every_2, strict=True):
        assert k1["backward passes"] == k2["backward passes"] == 4
        assert k2["optimizer steps"] == k1["optimizer steps"] / 2 == 2
        assert k2["reduce-scatters"] == k1["reduce-scatters"] / 2 > 0, (k1, k2)
        assert k2["all-gathers"] == k1["all-gathers"] > 0, (k1, k2)


@pytest.mark.slow
def test_fsdps_exchanges_are_drawn_beside_ddps_buckets(shared_run, drawing):
    runs = {
        title: traces(shared_run(command), drawing)
        for title, command in (("DDP", SMALL_BUCKETS), ("FSDP2", FSDP))
    }
    figure = drawing.draw_timelines(runs, title="a test")
    panels = [ax for ax in figure.axes if ax.get_title(loc="left")]
    assert [ax.get_title(loc="left") for ax in panels] == ["DDP", "FSDP2"]
    legend = [text.get_text() for text in figure.legends[0].get_texts()]
    assert {"all-reduce", "all-gather", "reduce-scatter", "forward", "backward"} <= set(legend), legend
    drawing.plt.close(figure)


@pytest.mark.slow
def test_fsdps_profiled_runs_end_with_ddps_weights(shared_run):
    # the profiler changes nothing, and accumulation with set_requires_gradient_sync is DDP's no_sync:
    # the same global batches, the same weights to the DDP proof's tolerance
    for fsdp, ddp in ((FSDP, SMALL_BUCKETS), (FSDP_ACCUMULATING, ACCUMULATING)):
        ours, theirs = (
            load_checkpoint(shared_run(command).out / "model_epoch_2.pt") for command in (fsdp, ddp)
        )
        assert max_weight_diff(ours, theirs) <= 1e-5, (fsdp, ddp)
