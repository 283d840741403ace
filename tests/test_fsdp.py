"""Proofs of what docs/fsdp.md says of train_fsdp.py, through the real entry points on the CPU (gloo):
FSDP2 at N processes of batch B trains as the baseline at N x B, its checkpoints resume in the
baseline and the DDP twin and theirs in it, a killed worker resumes bit for bit, and bad input gets
one clear line."""

import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from helpers import (
    FAULT,
    PROOF_FLAGS,
    as_flags,
    assert_fired,
    baseline_run,
    copy_scripts,
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


def test_its_checkpoints_are_train_ddp_pys_format_written_by_rank_0_alone(shared_run):
    # FSDP step 6: every rank gathers, rank 0 alone writes, and what it writes is what train_ddp.py
    # writes: plain tensors, the optimizer's parameters numbered, the same keys and shapes
    fsdp, ddp = fsdp_2(shared_run), shared_run(ddp_run(2))
    writers = set(re.findall(r"AUDIT rank=(\S+)", fsdp.proc.stderr))
    assert writers == {"0"}, f"ranks that wrote files: {writers}"
    assert "AUDIT rank=0 os.rename" in fsdp.proc.stderr  # the hook does see the checkpoints' writes
    assert fsdp.proc.stdout.count("epoch ") == 4  # rank 0 alone prints
    ours, theirs = (load_checkpoint(run.out / "model_epoch_4.pt") for run in (fsdp, ddp))
    assert ours.keys() == theirs.keys()
    assert {k: v.shape for k, v in ours["model_state_dict"].items()} == {
        k: v.shape for k, v in theirs["model_state_dict"].items()
    }
    assert all(type(v) is torch.Tensor for v in ours["model_state_dict"].values())  # no DTensor
    state, their_state = ours["optimizer_state_dict"], theirs["optimizer_state_dict"]
    assert state["param_groups"] == their_state["param_groups"]  # numbered 0 to 5, the same settings
    assert sorted(state["state"]) == sorted(their_state["state"]) == list(range(6))
    for number, buffers in state["state"].items():
        assert type(buffers["momentum_buffer"]) is torch.Tensor
        assert buffers["momentum_buffer"].shape == their_state["state"][number]["momentum_buffer"].shape


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


@pytest.mark.slow
def test_checkpoints_round_trip_between_the_baseline_ddp_and_fsdp(shared_run, work):
    # each resumes at epoch 3 from another's model_epoch_2.pt (the 4-epoch proof runs save epoch 2),
    # and ends with the weights of the uninterrupted baseline, to the DDP proof's tolerance
    base, ddp, fsdp = shared_run(baseline_run()), shared_run(ddp_run(2)), fsdp_2(shared_run)
    resumed = {
        "fsdp_from_base": f"{fsdp_run(2)} --resume {base.out}/model_epoch_2.pt",
        "fsdp_from_ddp": f"{fsdp_run(2)} --resume {ddp.out}/model_epoch_2.pt",
        "base_from_fsdp": f"{baseline_run()} --resume {fsdp.out}/model_epoch_2.pt",
        "ddp_from_fsdp": f"{ddp_run(2)} --resume {fsdp.out}/model_epoch_2.pt",
    }
    commands = [f"{command} --out_dir {out}" for out, command in resumed.items()]
    for pair in (commands[:2], commands[2:]):  # two at a time
        run_at_once(pair, cwd=work)
    full = load_checkpoint(base.out / "model_epoch_4.pt")
    for out in resumed:
        assert [r["epoch"] for r in read_metrics(work / out)] == [3, 4], out
        assert max_weight_diff(full, load_checkpoint(work / out / "model_epoch_4.pt")) < 1e-5, out


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
    assert "failed (exitcode: -9) local_rank: 1" in proc.stderr  # it was killed, and restarted
    assert [r["epoch"] for r in read_metrics(work / "killed")] == [1, 2, 3, 4]
    assert_bit_identical(
        load_checkpoint(fsdp_2(shared_run).out / "model_epoch_4.pt"),
        load_checkpoint(work / "killed/model_epoch_4.pt"),
    )


# 4. Bad input: one clear line, a non-zero exit, no files, no hang ---------------------------------


@pytest.fixture(scope="module")
def bad_files(work, shared_run):
    """Checkpoints that do not fit: another --hidden_size, a tensor of another shape, a tensor missing."""
    run("python single_gpu_baseline.py --epochs 1 --hidden_size 32 --out_dir narrow", cwd=work)
    fits = shared_run(baseline_run()).out / "model_epoch_2.pt"
    (work / "bad").mkdir()
    checkpoint = torch.load(fits, weights_only=True)
    checkpoint["model_state_dict"]["0.weight"] = torch.zeros(3, 3)
    torch.save(checkpoint, work / "bad/wrong_shape.pt")
    checkpoint = torch.load(fits, weights_only=True)
    del checkpoint["model_state_dict"]["0.bias"]  # torch 2.13 would load it silently (pytorch#153350)
    torch.save(checkpoint, work / "bad/no_bias.pt")
    return work


# under torchrun where FSDP2 loads the checkpoint (the processes have met, and sharded the model);
# under python what is refused before any FSDP2 code runs, alike under torchrun: DDP's flag, by the
# command line, and another --hidden_size, by the checkpoint's config
BAD_INPUT = [
    ("python", "--resume narrow/model_epoch_1.pt", "was trained with --hidden_size 32: pass that too"),
    ("torchrun", "--resume bad/wrong_shape.pt", "--resume bad/wrong_shape.pt does not fit this model: "),
    (
        "torchrun",
        "--resume bad/no_bias.pt",
        'does not fit this model: Missing key(s) in state_dict: "0.bias"',
    ),
    ("python", "--bucket_cap_mb 1", "unrecognized arguments: --bucket_cap_mb 1"),  # DDP's alone
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
