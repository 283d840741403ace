"""Proofs of what the guide only claims, each through the real entry points on the CPU:
DDP equals one big batch, a job survives a killed worker, two nodes equal one, and bad
input gets a clear error instead of a hang."""

import io
import os
import re
import socket
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from helpers import (
    FAULT,
    PROOF_FLAGS,
    ROOT,
    SMALL,
    STRAIGHT,
    TORCHRUN,
    as_flags,
    assert_failed,
    assert_fired,
    audit_env,
    baseline_run,
    copy_scripts,
    cpu_env,
    ddp_run,
    load_checkpoint,
    max_weight_diff,
    read_metrics,
    run,
    run_at_once,
    selected,
)
from torch.distributed.constants import default_pg_timeout

COUNT_ALLREDUCE = ROOT / "tests" / "count_allreduce.py"
TORCHRUN_2 = "torchrun --standalone --nproc_per_node=2"

# The reference runs (baseline_run, ddp_run, STRAIGHT) come from conftest.py's shared_run: made
# once a session, for every test here and in test_twins and test_faults that compares with them.


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """One folder for the module's own runs."""
    return copy_scripts(tmp_path_factory.mktemp("proofs"))


def counted(command):
    """command, with each rank's gradient all-reduces counted (count_allreduce.py: the training is
    unchanged)."""
    return command.replace("train_ddp.py", f"{COUNT_ALLREDUCE} train_ddp.py", 1)


def assert_same_training(a, b, epoch, tolerance):
    assert (
        max_weight_diff(
            load_checkpoint(a / f"model_epoch_{epoch}.pt"), load_checkpoint(b / f"model_epoch_{epoch}.pt")
        )
        <= tolerance
    )
    losses_a = [r["loss"] for r in read_metrics(a)]
    losses_b = [r["loss"] for r in read_metrics(b)]
    assert len(losses_a) == len(losses_b) == epoch, (losses_a, losses_b)  # an epoch's line each
    assert max(abs(x - y) for x, y in zip(losses_a, losses_b, strict=True)) <= tolerance


def listing(folder):
    """Each file's name and time of last change."""
    return sorted((p.name, p.stat().st_mtime_ns) for p in folder.iterdir())


def assert_bit_identical(a, b):
    a, b = a["model_state_dict"], b["model_state_dict"]
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


# 1. Equivalence --------------------------------------------------------------------------


# the quick tier (not slow): 2 processes, 2048 samples; the val_loss proof at 2 reads the same two runs
@pytest.mark.parametrize(
    "dataset_size",
    [2048, pytest.param(2000, marks=pytest.mark.slow)],
    ids=["divisible_by_N*B", "ragged_last_batch"],
)
@pytest.mark.parametrize("nproc", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_ddp_with_n_processes_equals_the_baseline_at_n_times_the_batch(shared_run, nproc, dataset_size):
    # the baseline at batch 64, DDP at nproc x 64/nproc
    base, ddp = shared_run(baseline_run(dataset_size=dataset_size), ddp_run(nproc, dataset_size=dataset_size))
    assert_same_training(base.out, ddp.out, epoch=4, tolerance=1e-5)


@pytest.mark.slow
def test_padding_makes_ddp_differ_when_n_does_not_divide_the_dataset(shared_run):
    # 2050 = 4 x 512 + 2: DistributedSampler repeats 2 samples to give every rank 513
    base, ddp = shared_run(baseline_run(dataset_size=2050), ddp_run(4, dataset_size=2050))
    assert {r["samples"] for r in read_metrics(base.out)} == {2050}
    assert {r["samples"] for r in read_metrics(ddp.out)} == {2052}  # two duplicates an epoch
    assert (
        max_weight_diff(
            load_checkpoint(base.out / "model_epoch_4.pt"), load_checkpoint(ddp.out / "model_epoch_4.pt")
        )
        > 1e-4
    )


# 2. Crash survival -----------------------------------------------------------------------

# STRAIGHT: 4 epochs of 4 optimizer steps on each of 2 ranks, saved every epoch, into straight/
RESUMING = f"--epochs 4 {SMALL} --resume auto"  # a restart continues from the latest checkpoint, if any
# torch 2.13's torchrun reuses its rendezvous store across restarts, so a restarted
# worker may read its dead peer's address and fail to connect: docs/runs-and-restarts.md, "Restarts"
RESTARTABLE = cpu_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")


@pytest.mark.slow
def test_a_killed_worker_is_restarted_and_the_job_ends_bit_identical(work, shared_run):
    # rank 1 kills itself at its 10th step, in epoch 3; torchrun restarts both workers,
    # which find model_epoch_2.pt in --out_dir by themselves (--resume auto)
    proc = run(
        f"{TORCHRUN_2} --max-restarts=1 {FAULT} kill@1:10 train_ddp.py {RESUMING} --out_dir killed",
        cwd=work,
        env=RESTARTABLE,
    )
    assert_fired(proc.stderr, "kill@1:10")
    assert_failed(proc.stderr, killed=1)  # it was killed, and restarted
    assert [r["epoch"] for r in read_metrics(work / "killed")] == [1, 2, 3, 4]
    assert_bit_identical(
        load_checkpoint(shared_run(STRAIGHT).out / "model_epoch_4.pt"),
        load_checkpoint(work / "killed/model_epoch_4.pt"),
    )


@pytest.mark.slow
def test_a_crash_while_writing_a_checkpoint_leaves_the_previous_one_loadable(work, shared_run):
    # rank 0 dies with model_epoch_3.pt half written: the restart resumes from epoch 2
    proc = run(
        f"{TORCHRUN_2} --max-restarts=1 {FAULT} cut@3 train_ddp.py {RESUMING} --out_dir cut",
        cwd=work,
        env=RESTARTABLE,
    )
    assert_fired(proc.stderr, "cut@3")  # a run never cut ends the same
    assert_failed(proc.stderr, killed=0)  # it was killed, and restarted
    assert [r["epoch"] for r in read_metrics(work / "cut")] == [1, 2, 3, 4]
    assert_bit_identical(
        load_checkpoint(shared_run(STRAIGHT).out / "model_epoch_4.pt"),
        load_checkpoint(work / "cut/model_epoch_4.pt"),
    )


@pytest.mark.slow
def test_a_fresh_run_refuses_an_out_dir_that_holds_checkpoints(shared_run, tmp_path):
    work = shared_run(STRAIGHT).copy_to(tmp_path)  # the folder the straight run was made in
    before = listing(work / "straight")
    proc = run(STRAIGHT, cwd=work, expect=1)  # the same command again
    assert (
        "already holds model_epoch_4.pt" in proc.stderr
        and "--resume straight/model_epoch_4.pt" in proc.stderr
    )
    assert listing(work / "straight") == before  # untouched


@pytest.mark.slow
def test_resuming_an_older_checkpoint_into_a_later_runs_out_dir_is_refused(shared_run, tmp_path):
    work = shared_run(STRAIGHT).copy_to(tmp_path)
    proc = run(
        f"python train_ddp.py --epochs 4 {SMALL} --out_dir straight --resume straight/model_epoch_2.pt",
        cwd=work,
        expect=2,
    )
    assert "already holds model_epoch_4.pt from an earlier run" in proc.stderr.splitlines()[-1]


@pytest.mark.slow
@pytest.mark.parametrize(
    "command, out",
    [
        ("python train_ddp.py --batch_size 64", "ws2_to_1"),
        ("torchrun --standalone --nproc_per_node=4 train_ddp.py --batch_size 16", "ws2_to_4"),
    ],
)
def test_a_checkpoint_resumes_at_another_world_size(work, shared_run, command, out):
    full, half = shared_run(ddp_run(2), ddp_run(2, epochs=2))  # 2 processes at batch 32, 4 and 2 epochs
    run(f"{command} {as_flags(**PROOF_FLAGS)} --resume {half.out}/model_epoch_2.pt --out_dir {out}", cwd=work)
    assert [r["epoch"] for r in read_metrics(work / out)] == [3, 4]
    assert (
        max_weight_diff(
            load_checkpoint(full.out / "model_epoch_4.pt"), load_checkpoint(work / out / "model_epoch_4.pt")
        )
        < 1e-5
    )


# 3. Two nodes on one machine -------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("per_node", [1, 2])
def test_two_nodes_on_one_machine_equal_one_node(work, shared_run, tmp_path, per_node):
    world = 2 * per_node
    single = shared_run(ddp_run(world))  # one node, world processes at batch 64/world
    out = work / f"nodes2x{per_node}"
    env = audit_env(tmp_path, watch=out)
    command = [*TORCHRUN, "--nnodes=2", f"--nproc_per_node={per_node}", "--rdzv-backend=c10d"]
    command += [f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=twonodes", "train_ddp.py"]
    command += [*as_flags(batch_size=64 // world, **PROOF_FLAGS).split(), "--out_dir", str(out)]
    agents = run_at_once([command, command], cwd=work, env=env)  # one torchrun agent per node
    writers = set(re.findall(r"AUDIT rank=(\S+)", "".join(agent.stderr for agent in agents)))
    assert writers == {"0"}, f"ranks that wrote files: {writers}"
    assert [r["world_size"] for r in read_metrics(out)] == [world] * 4
    assert (
        max_weight_diff(
            load_checkpoint(single.out / "model_epoch_4.pt"), load_checkpoint(out / "model_epoch_4.pt")
        )
        < 1e-6
    )


# 4. Bad input: one clear line, a non-zero exit, no files, no hang ------------------------


@pytest.fixture(scope="module")
def bad_files(work, shared_run):
    """Files a user might wrongly pass to --resume."""
    run("python single_gpu_baseline.py --epochs 1 --hidden_size 32 --out_dir narrow", cwd=work)
    good = work / "narrow/model_epoch_1.pt"
    bad = work / "bad"
    bad.mkdir()
    (bad / "empty.pt").write_bytes(b"")
    (bad / "cut.pt").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (bad / "notes.txt").write_text("not a checkpoint\n")
    torch.save(torch.ones(3), bad / "tensor.pt")
    (bad / "a_file").write_text("")
    torch.save({"epoch": 1, "payload": RunsCode()}, bad / "evil.pt")
    torch.save({"epoch": 1, "payload": OpensAFile()}, bad / "opens.pt")
    # the right keys, the wrong contents: a checkpoint of a run of the default width, changed
    fits = shared_run(baseline_run()).out / "model_epoch_2.pt"
    checkpoint = torch.load(fits, weights_only=True)
    checkpoint["model_state_dict"]["0.weight"] = torch.zeros(3, 3)
    torch.save(checkpoint, bad / "wrong_shape.pt")
    checkpoint = torch.load(fits, weights_only=True)
    del checkpoint["epoch"]
    torch.save(checkpoint, bad / "no_epoch.pt")
    checkpoint = torch.load(fits, weights_only=True)
    checkpoint["optimizer_state_dict"]["state"][0]["momentum_buffer"] = torch.zeros(3)
    torch.save(checkpoint, bad / "bad_momentum.pt")
    return {"good": good, "bad": bad}


class RunsCode:
    """Unpickled without weights_only, this would create the file PWNED."""

    def __reduce__(self):
        return (os.system, ("touch PWNED",))


class OpensAFile:
    """Unpickled without weights_only, this would open (and empty) a file: as the pitfall of DDP step 6
    builds it (torch names it otherwise than os.system: "Unsupported global")."""

    def __reduce__(self):
        return (io.open, ("PWNED", "w"))


BAD_INPUT = [
    ("--batch_size 0", "must be a whole number of at least 1"),
    ("--batch_size -3", "must be a whole number of at least 1"),
    ("--epochs -1", "must be a whole number of at least 1"),
    ("--lr 0", "must be a finite number above 0"),
    ("--lr -0.1", "must be a finite number above 0"),
    ("--lr nan", "must be a finite number above 0"),
    ("--num_workers -1", "--num_workers must be 0 or more"),
    ("--no_such_flag", "unrecognized arguments: --no_such_flag"),
    ("--resume missing.pt", "no such file"),
    ("--resume bad/empty.pt", "not a whole checkpoint"),
    ("--resume bad/cut.pt", "not a whole checkpoint"),
    ("--resume bad/notes.txt", "not a whole checkpoint"),
    ("--resume bad/tensor.pt", "not a whole checkpoint"),
    ("--resume narrow/model_epoch_1.pt", "was trained with --hidden_size 32"),
    ("--resume bad/evil.pt", "refused, loading it would run code"),
    ("--resume bad/opens.pt", "refused, loading it would run code"),
    ("--resume bad/wrong_shape.pt", "does not fit this model: size mismatch for 0.weight"),
    ("--resume bad/no_epoch.pt", "not a whole checkpoint"),
    ("--resume bad/bad_momentum.pt", "does not fit this model: a momentum buffer of shape (3,)"),
    ("--out_dir bad/a_file/out", "is not a writable folder"),
    ("--device cuda", "no CUDA GPU"),
    ("--grad_accum_steps 0", "must be a whole number of at least 1"),
    ("--grad_accum_steps 100", "--grad_accum_steps 100 is more than the"),
    ("--bucket_cap_mb 0", "must be a finite number above 0"),
    ("--profile --epochs 1", "--profile records the second epoch"),
    ("--profile --dataset_size 256", "--profile records batches 3 to 6 of an epoch, which has 4 here"),
]


# Under torchrun, one case of each place a refusal is made: the command line (test_faults,
# test_under_torchrun_a_refusal_is_printed_once_and_nothing_waits, the same assertions and more),
# and, once the processes have met, the checkpoint (unreadable, unsafe, not fitting) and the
# accumulation that exceeds an epoch. The other cases take the same path there; torchrun costs
# each of them seconds.
TORCHRUN_CASES = (
    "--resume bad/empty.pt",
    "--resume bad/evil.pt",
    "--resume bad/wrong_shape.pt",
)
UNDER_TORCHRUN = [case for case in BAD_INPUT if case[0] in (*TORCHRUN_CASES, "--grad_accum_steps 100")]
CASES = [("python", *case) for case in BAD_INPUT] + [("torchrun", *case) for case in UNDER_TORCHRUN]


def refuse(work, launcher, flags):
    command = "python train_ddp.py" if launcher == "python" else f"{TORCHRUN_2} train_ddp.py"
    return run(f"{command} {flags}", cwd=work, expect=None, timeout=90)


@pytest.fixture(scope="module")
def refusals(request, work, bad_files):
    """The run of each case this session tests, two at a time from the first case on, each test then
    waiting for its own: a run here imports torch and stops, on one core, and two share 2 cores."""
    pool = ThreadPoolExecutor(max_workers=2)
    cases = selected(request, test_bad_input_gets_one_clear_line_and_no_hang)
    yield {(c["launcher"], c["flags"]): pool.submit(refuse, work, c["launcher"], c["flags"]) for c in cases}
    pool.shutdown(cancel_futures=True)


@pytest.mark.slow
@pytest.mark.parametrize("launcher, flags, message", CASES, ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_bad_input_gets_one_clear_line_and_no_hang(work, refusals, launcher, flags, message):
    proc = refusals[launcher, flags].result()
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train_ddp.py: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr  # once, under torchrun too
    assert 'train_ddp.py", line' not in proc.stderr, "the script itself printed a traceback"
    if launcher == "python":  # argparse's exit status for usage errors, and nothing after the line
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        assert message in proc.stderr.splitlines()[-1]
    assert not (work / "out").exists(), "a failed run left files behind"  # where it would have written
    assert not (work / "PWNED").exists()


@pytest.mark.slow
def test_a_dataset_smaller_than_the_job_is_padded_not_refused(work):
    # DistributedSampler repeats samples until every rank has as many: 1 sample, 2 ranks, 2 seen
    run(f"{TORCHRUN_2} train_ddp.py --dataset_size 1 --epochs 2 --out_dir tiny", cwd=work, timeout=90)
    assert [r["samples"] for r in read_metrics(work / "tiny")] == [2, 2]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU machine")
def test_more_processes_than_gpus_is_refused(work):
    n = torch.cuda.device_count() + 1
    command = f"torchrun --standalone --nproc_per_node={n} train_ddp.py --out_dir many"
    proc = run(command, cwd=work, env=dict(os.environ), expect=1)  # the GPUs, not the CPU
    assert f"use --nproc_per_node={n - 1} or fewer" in proc.stderr


# A bound on a wait, not a speed: gloo's collectives time out after torch's default 30 minutes
# (train_ddp.py sets none), so a job that ends inside this did not wait for that timeout.
ENDS_WITHIN_S = 300
assert ENDS_WITHIN_S < default_pg_timeout.total_seconds() / 5


@pytest.mark.slow
def test_a_worker_that_fails_mid_epoch_ends_the_whole_job(work):
    # rank 1 raises in epoch 2, while rank 0 waits for it in an all-reduce: rank 0's all-reduce
    # fails as its peer's connection closes, torchrun stops it, and the job fails at once
    proc = run(
        f"{TORCHRUN_2} {FAULT} raise@1:40 train_ddp.py --out_dir failing",
        cwd=work,
        expect=None,
        timeout=ENDS_WITHIN_S,
    )
    assert_fired(proc.stderr, "raise@1:40")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "injected fault at step 40 of rank 1" in proc.stderr
    assert "Timed out" not in proc.stderr, "a rank waited for the process group's timeout"
    # torchrun's report: rank 1's failure is the job's first, and rank 0 ended with it. torchrun
    # names whichever process it saw end first: once, under load, rank 0, aborted at its exit by
    # torch 2.13's gloo (pytorch#190489) before rank 1's end was seen; then rank 0's own error must
    # be its peer's going
    root_cause = re.search(r"Root Cause \(first observed failure\):\n(?:.*\n)*? +rank +: (\d+) ", proc.stderr)
    peer_gone = re.search(r"\[rank0\]: RuntimeError: .*Connection (closed|reset) by peer", proc.stderr)
    assert root_cause and (root_cause.group(1) == "1" or peer_gone), proc.stderr


# Beyond the guide: gradient accumulation and exact evaluation -----------------------------


# 2 processes x 8 samples x 4 micro-batches: one optimizer step of the baseline's 64
ACCUMULATING = ddp_run(2, batch_size=8, grad_accum_steps=4)


@pytest.mark.slow
def test_gradient_accumulation_equals_one_big_batch(shared_run):
    big, same_k, ddp = shared_run(
        baseline_run(), baseline_run(batch_size=16, grad_accum_steps=4), counted(ACCUMULATING)
    )
    assert_same_training(big.out, ddp.out, epoch=4, tolerance=1e-5)  # 2 processes x 8 x 4 steps = 64
    assert_same_training(same_k.out, ddp.out, epoch=4, tolerance=1e-5)  # and the baseline at 4 x 16


@pytest.mark.slow
def test_no_sync_cuts_the_all_reduces_by_k(shared_run):
    # the same micro-batches of 8: an optimizer step after each, then after every 4
    each, every_4 = shared_run(counted(ddp_run(2, batch_size=8)), counted(ACCUMULATING))
    counts = {
        k: sorted(map(int, re.findall(r"ALLREDUCES rank=\d calls=(\d+)", job.proc.stderr)))
        for k, job in ((1, each), (4, every_4))
    }
    assert len(counts[1]) == 2 and counts[1][0] == counts[1][1] > 0, counts
    assert counts[1] == [4 * c for c in counts[4]], counts  # 4 x 128 batches: 512 all-reduces, then 128


@pytest.mark.parametrize(
    "nproc, base_batch, dataset_size",
    [
        pytest.param(1, 64, 2048, marks=pytest.mark.slow),
        (2, 64, 2048),
        pytest.param(3, 96, 2016, marks=pytest.mark.slow),
        pytest.param(4, 64, 2048, marks=pytest.mark.slow),
    ],
)
def test_val_loss_is_exact_at_any_world_size(shared_run, nproc, base_batch, dataset_size):
    # 499 held-out samples (PROOF_FLAGS): no N here divides them, so the shards differ in size;
    # 2016 = 3 x 672: 3 processes at batch 32 see the same global batches as the baseline at 96
    base, ddp = shared_run(
        baseline_run(batch_size=base_batch, dataset_size=dataset_size),
        ddp_run(nproc, batch_size=base_batch // nproc, dataset_size=dataset_size),
    )
    base_records, ddp_records = read_metrics(base.out), read_metrics(ddp.out)
    assert len(base_records) == PROOF_FLAGS["epochs"], base_records  # every epoch evaluated, in both
    for b, d in zip(base_records, ddp_records, strict=True):
        assert abs(b["val_loss"] - d["val_loss"]) <= 1e-6, (b, d)


# 6. Concurrency --------------------------------------------------------------------------


@pytest.mark.slow
def test_two_standalone_jobs_at_once_both_finish(work):
    run_at_once([f"{TORCHRUN_2} train_ddp.py --epochs 3 --out_dir together{i}" for i in range(2)], cwd=work)
    for i in range(2):  # each wrote its own files, whole
        assert [r["epoch"] for r in read_metrics(work / f"together{i}")] == [1, 2, 3]
    first, second = (load_checkpoint(work / f"together{i}/model_epoch_3.pt") for i in range(2))
    assert_bit_identical(first, second)  # and neither disturbed the other's training
