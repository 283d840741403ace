"""Proofs of what docs/fsdp.md says of train_fsdp.py, through the real entry points on the CPU (gloo):
FSDP2 at N processes of batch B trains as the baseline at N x B, no rank ever holds the whole model,
every rank writes its own shards, a sharded checkpoint resumes at another world size and converts
into a file the baseline resumes from, the whole files of the three twins resume in each other,
rank 0 alone reading them, the optimizer's state goes by name, a killed worker resumes bit for bit,
even killed mid-save, and bad input gets one clear line."""

import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from helpers import (
    FAULT,
    PROOF_FLAGS,
    ROOT,
    as_flags,
    assert_failed,
    assert_fired,
    baseline_run,
    copy_scripts,
    cpu_env,
    ddp_run,
    fsdp_run,
    load_checkpoint,
    max_weight_diff,
    read_metrics,
    run,
    run_at_once,
    selected,
)
from test_proofs import RESTARTABLE, assert_bit_identical, assert_same_training

TORCHRUN_2 = "torchrun --standalone --nproc_per_node=2"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """One folder for the module's own runs."""
    return copy_scripts(tmp_path_factory.mktemp("fsdp"))


def fsdp_2(shared_run):
    """FSDP2 at 2 processes of 32, PROOF_FLAGS, made once a session for every test that reads it, with
    every worker's file writes reported on its stderr (helpers.audit_env)."""
    return shared_run(fsdp_run(2), audit=True)


# 1. Equivalence ------------------------------------------------------------------------------------


@pytest.mark.parametrize("nproc", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_fsdp_with_n_processes_equals_the_baseline_at_n_times_the_batch(shared_run, nproc):
    # the DDP proof's tolerance: each rank steps its own shard of the weights, with the mean of its rows
    # of the gradients, and the ranks together hold the baseline's weights, to float rounding
    # at 4, 2 epochs (4 processes share 2 cores here, and each optimizer step is 9 exchanges)
    epochs = PROOF_FLAGS["epochs"] if nproc == 2 else 2
    base = shared_run(baseline_run(epochs=epochs))
    fsdp = fsdp_2(shared_run) if nproc == 2 else shared_run(fsdp_run(nproc, epochs=epochs))
    assert_same_training(base.out, fsdp.out, epoch=epochs, tolerance=1e-5)
    for b, f in zip(read_metrics(base.out), read_metrics(fsdp.out), strict=True):
        assert abs(b["val_loss"] - f["val_loss"]) <= 1e-6 and f["world_size"] == nproc, (b, f)


def test_every_rank_writes_its_shards_and_rank_0_alone_the_last_epochs_whole_file(shared_run):
    # FSDP step 6: at each save (epochs 2 and 4), every rank writes its own shards into the folder
    # model_epoch_E, and rank 0 alone the folder's index, .metadata; after the last, rank 0 alone writes
    # the whole model, model_epoch_4.pt, and only rank 0 writes the metrics and prints
    fsdp = fsdp_2(shared_run)
    by_file = {}  # each file or folder under --out_dir written (opened to write, made, renamed): by whom
    for rank, path in re.findall(r"AUDIT rank=(\S+) \S+ (\S+)", fsdp.proc.stderr):
        path = fsdp.folder / path  # as the process named it: relative to where the run was started
        if path.is_relative_to(fsdp.out) and path != fsdp.out:
            by_file.setdefault(str(path.relative_to(fsdp.out)), set()).add(rank)
    assert by_file["model_epoch_4.pt.tmp"] == {"0"}, by_file  # the hook sees the writes
    for epoch in (2, 4):
        for rank in ("0", "1"):
            assert by_file[f"model_epoch_{epoch}/__{rank}_0.distcp"] == {rank}, by_file
        assert by_file[f"model_epoch_{epoch}/.metadata.tmp"] == {"0"}, by_file
    shards = {name for name in by_file if re.fullmatch(r"model_epoch_\d+(/.*)?", name)}
    assert {rank for name in by_file.keys() - shards for rank in by_file[name]} == {"0"}, by_file
    assert sorted(p.name for p in fsdp.out.glob("model_epoch_*")) == [
        "model_epoch_2",
        "model_epoch_4",
        "model_epoch_4.pt",
    ]
    assert fsdp.proc.stdout.count("epoch ") == 4  # rank 0 alone prints


def test_its_whole_file_is_train_ddp_pys_format_its_optimizer_state_keyed_by_name(shared_run):
    # the same keys, shapes and plain tensors as train_ddp.py's file; the optimizer's state keyed by
    # parameter name, in the order of the optimizer's groups, where train_ddp.py's numbers them: the
    # order in which optimizer.load_state_dict puts them back (the round trip below loads them)
    fsdp, ddp = fsdp_2(shared_run), shared_run(ddp_run(2))
    ours, theirs = (load_checkpoint(run.out / "model_epoch_4.pt") for run in (fsdp, ddp))
    assert ours.keys() == theirs.keys()
    assert {k: v.shape for k, v in ours["model_state_dict"].items()} == {
        k: v.shape for k, v in theirs["model_state_dict"].items()
    }
    assert all(type(v) is torch.Tensor for v in ours["model_state_dict"].values())  # no DTensor
    state, their_state = ours["optimizer_state_dict"], theirs["optimizer_state_dict"]
    names = list(ours["model_state_dict"])  # one group: the optimizer's order is the model's
    assert [{**g, "params": None} for g in state["param_groups"]] == [
        {**g, "params": None} for g in their_state["param_groups"]
    ]  # the same settings
    assert state["param_groups"][0]["params"] == names and their_state["param_groups"][0]["params"] == [
        *range(len(names))
    ]
    assert list(state["state"]) == names
    for number, name in enumerate(names):
        assert type(state["state"][name]["momentum_buffer"]) is torch.Tensor
        assert (
            state["state"][name]["momentum_buffer"].shape
            == their_state["state"][number]["momentum_buffer"].shape
        )


@pytest.mark.slow
def test_no_rank_ever_holds_the_whole_model(tmp_path):
    # FSDP step 4: tests/whole_model.py counts, after every operation of the run, the numbers the
    # model's modules hold whole (not meta, not a shard): built on the meta device and drawn one block
    # at a time, each block sharded before the next, and gathered one block at a time to compute, an
    # FSDP2 rank holds one block whole at most, never all of it; the baseline, the same count, holds it
    # whole (the count sees a whole model where there is one)
    work = copy_scripts(tmp_path)
    shutil.copy(ROOT / "tests/whole_model.py", work / "whole_model.py")
    fsdp, base = run_at_once(
        [
            "torchrun --standalone --nproc_per_node=2 whole_model.py train_fsdp.py --epochs 2 --out_dir fsdp",
            "python whole_model.py single_gpu_baseline.py --epochs 2 --out_dir base",
        ],
        cwd=work,
    )
    (baseline,) = [json.loads(line) for line in re.findall(r"^WHOLE_MODEL (.*)$", base.stderr, re.M)]
    assert baseline["most_whole"] == baseline["parameters"] > 0, baseline
    ranks = [json.loads(line) for line in re.findall(r"^WHOLE_MODEL (.*)$", fsdp.stderr, re.M)]
    assert sorted(r["rank"] for r in ranks) == [0, 1], fsdp.stderr[-3000:]
    for rank in ranks:
        assert rank["parameters"] == baseline["parameters"], rank
        # one block whole at a time, the largest at its most: never all three at once
        assert rank["most_whole"] == max(rank["blocks"].values()) < rank["parameters"], rank
    assert [r["epoch"] for r in read_metrics(work / "fsdp")] == [1, 2]


# FSDP step 10 and FSDP step 4 at their edges: 65 held-out samples at batch 32 on 2 ranks give rank 0
# two batches (33 samples) and rank 1 one (32); at --hidden_size 1, every layer has one row, so rank 1
# holds nothing of any weight
EDGES = {"hidden_size": 1, "val_size": 65, "epochs": 2}


@pytest.mark.slow
def test_evaluation_counts_each_held_out_sample_once_when_the_ranks_need_different_batch_counts(shared_run):
    # every rank runs as many forwards (each all-gathers): a rank a batch short runs an empty one
    base, fsdp = shared_run(baseline_run(**EDGES), fsdp_run(2, **EDGES))
    for b, f in zip(read_metrics(base.out), read_metrics(fsdp.out), strict=True):
        assert abs(b["val_loss"] - f["val_loss"]) <= 1e-6, (b, f)


@pytest.mark.slow
def test_there_is_no_sharding_to_refuse_a_rank_holding_no_weights_trains_as_the_baseline(shared_run):
    base, fsdp = shared_run(baseline_run(**EDGES), fsdp_run(2, **EDGES))
    assert_same_training(base.out, fsdp.out, epoch=2, tolerance=1e-5)


# 2. Checkpoints across the three scripts -----------------------------------------------------------


# Reports each file a process opens to read whose name ends in .pt, with its rank, on stderr: an audit
# hook in every process, through sitecustomize
READ_HOOK = """
import os, sys
def hook(event, args):
    reading = event == "open" and isinstance(args[0], str) and not set(args[1] or "r") & set("wax+")
    if reading and args[0].endswith(".pt"):
        sys.stderr.write(f"READ rank={os.environ.get('RANK')} {os.path.abspath(args[0])}\\n")
sys.addaudithook(hook)
"""


@pytest.mark.slow
def test_checkpoints_round_trip_between_the_baseline_ddp_and_fsdp(shared_run, work):
    # each resumes at epoch 3 from another's model_epoch_2.pt (the 4-epoch proof runs save epoch 2;
    # train_fsdp.py's whole file is its last epoch's, so the others resume from its epoch 2 converted,
    # below, and here from its own 2-epoch run's), and ends with the weights of the uninterrupted
    # baseline, to the DDP proof's tolerance. FSDP step 6: of a whole file, rank 0 alone reads it.
    base, ddp, fsdp = shared_run(baseline_run()), shared_run(ddp_run(2)), shared_run(fsdp_run(2, epochs=2))
    resumed = {
        "fsdp_from_base": f"{fsdp_run(2)} --resume {base.out}/model_epoch_2.pt",
        "fsdp_from_ddp": f"{fsdp_run(2)} --resume {ddp.out}/model_epoch_2.pt",
        "base_from_fsdp": f"{baseline_run()} --resume {fsdp.out}/model_epoch_2.pt",
        "ddp_from_fsdp": f"{ddp_run(2)} --resume {fsdp.out}/model_epoch_2.pt",
    }
    commands = [f"{command} --out_dir {out}" for out, command in resumed.items()]
    (work / "read_hook").mkdir()
    (work / "read_hook/sitecustomize.py").write_text(READ_HOOK)
    reading = cpu_env(PYTHONPATH=str(work / "read_hook"))
    procs = run_at_once(commands[:2], cwd=work, env=reading) + run_at_once(commands[2:], cwd=work)
    full = load_checkpoint(base.out / "model_epoch_4.pt")
    for out in resumed:
        assert [r["epoch"] for r in read_metrics(work / out)] == [3, 4], out
        assert max_weight_diff(full, load_checkpoint(work / out / "model_epoch_4.pt")) < 1e-5, out
    for proc, source in zip(procs[:2], (base, ddp), strict=True):
        readers = set(
            re.findall(rf"^READ rank=(\S+) {re.escape(str(source.out))}/model_epoch_2.pt$", proc.stderr, re.M)
        )
        assert readers == {"0"}, f"ranks that read the whole file: {readers}"


@pytest.mark.slow
def test_a_sharded_checkpoint_saved_at_2_resumes_at_4_to_the_uninterrupted_runs_weights(shared_run, tmp_path):
    # FSDP step 6: the folder model_epoch_2 of 2 ranks, each rank of 4 reading its own shards of it
    # (DCP reshards on load), resumed at batch 16 (the same global batch): it ends as the run that
    # never stopped, to the DDP proof's tolerance, and its metrics carry on from epoch 3
    fsdp = fsdp_2(shared_run)
    work = fsdp.copy_to(tmp_path / "resumed")
    out = fsdp.out.relative_to(fsdp.folder)
    shutil.rmtree(work / out / "model_epoch_4")
    (work / out / "model_epoch_4.pt").unlink()  # the run that goes on from epoch 2 writes them again
    run(f"{fsdp_run(4)} --out_dir {out} --resume {out}/model_epoch_2", cwd=work)
    assert [(r["epoch"], r["world_size"]) for r in read_metrics(work / out)] == [
        (1, 2),
        (2, 2),
        (3, 4),
        (4, 4),
    ]
    ours, uninterrupted = (load_checkpoint(f / out / "model_epoch_4.pt") for f in (work, fsdp.folder))
    assert max_weight_diff(uninterrupted, ours) < 1e-5


# the command docs/fsdp.md gives to turn a sharded checkpoint into one file, as a learner copies it
CONVERT = re.compile(
    r"^\s*python -m torch\.distributed\.checkpoint\.format_utils dcp_to_torch (\S+) (\S+)", re.M
)


@pytest.mark.slow
def test_the_pages_command_converts_a_sharded_checkpoint_into_a_file_the_baseline_resumes_from(
    shared_run, tmp_path
):
    # the folder model_epoch_2 of FSDP at 2 ranks, converted by the command of docs/fsdp.md into one
    # file; the baseline resumes from it and ends as the baseline that never stopped
    (source, target), *_ = CONVERT.findall((ROOT / "docs/fsdp.md").read_text())
    work = copy_scripts(tmp_path)
    shutil.copytree(fsdp_2(shared_run).out / "model_epoch_2", work / source)
    run(f"python -m torch.distributed.checkpoint.format_utils dcp_to_torch {source} {target}", cwd=work)
    run(f"{baseline_run()} --resume {target} --out_dir converted", cwd=work)
    assert [r["epoch"] for r in read_metrics(work / "converted")] == [3, 4]
    full = load_checkpoint(shared_run(baseline_run()).out / "model_epoch_4.pt")
    assert max_weight_diff(full, load_checkpoint(work / "converted/model_epoch_4.pt")) < 1e-5


def test_the_optimizer_state_is_keyed_by_name_with_two_parameter_groups_of_equal_shapes(tmp_path):
    # tests/two_groups.py: train_fsdp.py's own load_checkpoint and save_checkpoint, on an optimizer whose
    # groups put its weights (all 4 x 4) in an order not the model's: a numbered file of the plain
    # model's, then the sharded checkpoint and the whole file saved from that, each loaded into a fresh
    # sharded model; each weight's momentum is the plain optimizer's for that weight
    proc = run(
        f"torchrun --standalone --nproc_per_node=2 {ROOT / 'tests/two_groups.py'} {tmp_path}", cwd=tmp_path
    )
    loaded = dict(re.findall(r"^LOADED (\S+) (\S+)$", proc.stdout, re.M))
    assert loaded.keys() == {"numbered", "sharded", "whole"}, proc.stdout
    assert all(float(gap) <= 1e-6 for gap in loaded.values()), loaded


# 3. Crash survival ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_killed_worker_is_restarted_and_the_job_ends_bit_identical(shared_run, work):
    # rank 1 kills itself at its 70th optimizer step, in epoch 3 (32 a rank an epoch); torchrun
    # restarts both workers, which find model_epoch_2.pt in --out_dir by themselves (--resume auto)
    flags = f"{as_flags(batch_size=32, **PROOF_FLAGS)} --resume auto --out_dir killed"
    proc = run(
        f"{TORCHRUN_2} --max-restarts=1 {FAULT} kill@1:70 train_fsdp.py {flags}",
        cwd=work,
        env=RESTARTABLE,
    )
    assert_fired(proc.stderr, "kill@1:70")
    assert_failed(proc.stderr, killed=1)  # it was killed, and restarted
    assert [r["epoch"] for r in read_metrics(work / "killed")] == [1, 2, 3, 4]
    assert_bit_identical(
        load_checkpoint(fsdp_2(shared_run).out / "model_epoch_4.pt"),
        load_checkpoint(work / "killed/model_epoch_4.pt"),
    )


@pytest.mark.slow
def test_a_worker_killed_mid_save_leaves_the_previous_checkpoint_loadable(shared_run, work):
    # the last rank dies with SIGKILL half-way through writing its shards of model_epoch_4: the
    # folder never gets its .metadata. torchrun restarts both workers; --resume auto passes over the
    # cut folder and takes model_epoch_2, complete; epochs 3 and 4 run again, the save of epoch 4
    # writes over the cut folder, and the job ends with weights bit-identical to a run never killed
    flags = f"{as_flags(batch_size=32, **PROOF_FLAGS)} --resume auto --out_dir cut"
    proc = run(
        f"{TORCHRUN_2} --max-restarts=1 {FAULT} cut@4 train_fsdp.py {flags}",
        cwd=work,
        env=RESTARTABLE,
    )
    assert_fired(proc.stderr, "cut@4")
    assert re.search(r"cut@4 fired: \S+/cut/model_epoch_4/__1_0.distcp cut to", proc.stderr), proc.stderr
    assert_failed(proc.stderr, killed=1)  # it was killed, and restarted
    assert proc.stdout.count("epoch 3/4") == 2, proc.stdout  # the restart went on from model_epoch_2
    assert [r["epoch"] for r in read_metrics(work / "cut")] == [1, 2, 3, 4]
    assert (work / "cut/model_epoch_4/.metadata").is_file()
    assert_bit_identical(
        load_checkpoint(fsdp_2(shared_run).out / "model_epoch_4.pt"),
        load_checkpoint(work / "cut/model_epoch_4.pt"),
    )


@pytest.mark.slow
def test_resume_auto_passes_over_a_whole_save_cut_short(shared_run, work):
    # a process killed while it wrote the last epoch's whole file leaves model_epoch_E.pt.tmp: not a
    # checkpoint, and no epoch number; --resume auto takes the sharded folder beside it, and the
    # stray file goes
    shutil.copytree(fsdp_2(shared_run).out, work / "stray")
    (work / "stray/model_epoch_5.pt.tmp").write_bytes(b"half a checkpoint")
    flags = f"{as_flags(batch_size=32, **PROOF_FLAGS)} --resume auto --out_dir stray"
    proc = run(f"python train_fsdp.py {flags}", cwd=work)
    assert "stray/model_epoch_4 has done all 4 epochs" in proc.stdout, proc.stdout
    assert not (work / "stray/model_epoch_5.pt.tmp").exists()


# 4. Bad input: one clear line, a non-zero exit, no files, no hang ---------------------------------


@pytest.fixture(scope="module")
def bad_files(work, shared_run):
    """Checkpoints that do not fit: another --hidden_size, a tensor of another shape, a tensor missing;
    and a sharded checkpoint's folder cut short, without its .metadata."""
    run("python single_gpu_baseline.py --epochs 1 --hidden_size 32 --out_dir narrow", cwd=work)
    fits = shared_run(baseline_run()).out / "model_epoch_2.pt"
    (work / "bad").mkdir()
    checkpoint = torch.load(fits, weights_only=True)
    checkpoint["model_state_dict"]["0.weight"] = torch.zeros(3, 3)
    torch.save(checkpoint, work / "bad/wrong_shape.pt")
    checkpoint = torch.load(fits, weights_only=True)
    del checkpoint["model_state_dict"]["0.bias"]  # torch 2.13 would load it silently (pytorch#153350)
    torch.save(checkpoint, work / "bad/no_bias.pt")
    shutil.copytree(fsdp_2(shared_run).out / "model_epoch_2", work / "bad/cut_short")
    (work / "bad/cut_short/.metadata").unlink()
    return work


# under torchrun where FSDP2 loads the checkpoint (the processes have met, and sharded the model);
# under python what is refused before any FSDP2 code runs, alike under torchrun: DDP's flag and a
# sharded checkpoint cut short, by the command line; another --hidden_size, by the checkpoint's config
BAD_INPUT = [
    ("python", "--resume narrow/model_epoch_1.pt", "was trained with --hidden_size 32: pass that too"),
    ("torchrun", "--resume bad/wrong_shape.pt", "--resume bad/wrong_shape.pt does not fit this model: "),
    (
        "torchrun",
        "--resume bad/no_bias.pt",
        'does not fit this model: Missing key(s) in state_dict: "0.bias"',
    ),
    ("python", "--bucket_cap_mb 1", "unrecognized arguments: --bucket_cap_mb 1"),  # DDP's alone
    ("python", "--resume bad/cut_short", "--resume bad/cut_short: no whole checkpoint; pass a model_epoch_E"),
]


def refuse(work, launcher, flags):
    command = "python train_fsdp.py" if launcher == "python" else f"{TORCHRUN_2} train_fsdp.py"
    return run(f"{command} {flags}", cwd=work, expect=None, timeout=90)


@pytest.fixture(scope="module")
def refusals(request, bad_files):
    """The run of each case this session tests, two at a time, each test then waiting for its own."""
    pool = ThreadPoolExecutor(max_workers=2)
    cases = selected(request, test_bad_input_gets_one_clear_line_and_no_hang)
    yield {case["flags"]: pool.submit(refuse, bad_files, case["launcher"], case["flags"]) for case in cases}
    pool.shutdown(cancel_futures=True)


@pytest.mark.slow
@pytest.mark.parametrize("launcher, flags, message", BAD_INPUT, ids=[f"{c[0]}: {c[1]}" for c in BAD_INPUT])
def test_bad_input_gets_one_clear_line_and_no_hang(work, refusals, launcher, flags, message):
    proc = refusals[flags].result()
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train_fsdp.py: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr  # once, from local rank 0
    assert 'train_fsdp.py", line' not in proc.stderr, "the script itself printed a traceback"
    assert not (work / "out").exists(), "a refused run left files behind"
