"""Proofs of what the guide only claims, each through the real entry points on the CPU:
DDP equals one big batch, a job survives a killed worker, two nodes equal one, and bad
input gets a clear error instead of a hang."""

import os
import re
import socket
import subprocess

import pytest
import torch
from helpers import (
    ROOT,
    TORCHRUN,
    audit_env,
    copy_scripts,
    cpu_env,
    load_checkpoint,
    max_weight_diff,
    read_metrics,
    run,
)

FAULT = ROOT / "tests" / "fault.py"
COUNT_ALLREDUCE = ROOT / "tests" / "count_allreduce.py"
TORCHRUN_2 = "torchrun --standalone --nproc_per_node=2"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """One folder for the module's runs, so that reference runs are made once."""
    return copy_scripts(tmp_path_factory.mktemp("proofs"))


@pytest.fixture(scope="module")
def reference(work):
    """Run a command once per module (--out_dir named after it); return its output folder."""
    done = {}

    def make(command, name):
        if name not in done:
            run(f"{command} --out_dir {name}", cwd=work)
            done[name] = work / name
        return done[name]

    return make


def assert_same_training(a, b, epoch, tolerance):
    assert (
        max_weight_diff(
            load_checkpoint(a / f"model_epoch_{epoch}.pt"), load_checkpoint(b / f"model_epoch_{epoch}.pt")
        )
        <= tolerance
    )
    losses_a = [r["loss"] for r in read_metrics(a)]
    losses_b = [r["loss"] for r in read_metrics(b)]
    assert len(losses_a) == len(losses_b)
    assert max(abs(x - y) for x, y in zip(losses_a, losses_b, strict=True)) <= tolerance


def assert_bit_identical(a, b):
    a, b = a["model_state_dict"], b["model_state_dict"]
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


# 1. Equivalence --------------------------------------------------------------------------


@pytest.mark.parametrize("dataset_size", [2048, 2000], ids=["divisible_by_N*B", "ragged_last_batch"])
@pytest.mark.parametrize("nproc", [2, 4])
def test_ddp_with_n_processes_equals_the_baseline_at_n_times_the_batch(reference, nproc, dataset_size):
    flags = f"--epochs 4 --dataset_size {dataset_size}"
    base = reference(f"python single_gpu_baseline.py --batch_size 64 {flags}", f"base_{dataset_size}")
    ddp = reference(
        f"torchrun --standalone --nproc_per_node={nproc} train_ddp.py --batch_size {64 // nproc} {flags}",
        f"ddp{nproc}_{dataset_size}",
    )
    assert_same_training(base, ddp, epoch=4, tolerance=1e-5)


def test_padding_makes_ddp_differ_when_n_does_not_divide_the_dataset(reference):
    # 2050 = 4 x 512 + 2: DistributedSampler repeats 2 samples to give every rank 513
    flags = "--epochs 4 --dataset_size 2050"
    base = reference(f"python single_gpu_baseline.py --batch_size 64 {flags}", "base_2050")
    ddp = reference(
        f"torchrun --standalone --nproc_per_node=4 train_ddp.py --batch_size 16 {flags}", "ddp4_2050"
    )
    assert {r["samples"] for r in read_metrics(base)} == {2050}
    assert {r["samples"] for r in read_metrics(ddp)} == {2052}  # two duplicates an epoch
    assert (
        max_weight_diff(load_checkpoint(base / "model_epoch_4.pt"), load_checkpoint(ddp / "model_epoch_4.pt"))
        > 1e-4
    )


# 2. Crash survival -----------------------------------------------------------------------

CRASH_RUN = "--epochs 6 --save_interval 1 --dataset_size 4096"
RESUMING = f"{CRASH_RUN} --resume auto"  # a restart continues from the latest checkpoint, if any
# torch 2.13's torchrun reuses its rendezvous store across restarts, so a restarted
# worker may read its dead peer's address and fail to connect: README, "Restarts"
RESTARTABLE = cpu_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")


def test_a_killed_worker_is_restarted_and_the_job_ends_bit_identical(work, reference):
    clean = reference(f"{TORCHRUN_2} train_ddp.py {CRASH_RUN}", "clean")
    # rank 1 kills itself in epoch 3 (32 steps an epoch); torchrun restarts both workers,
    # which find model_epoch_2.pt in --out_dir by themselves (--resume auto)
    proc = run(
        f"{TORCHRUN_2} --max-restarts=1 {FAULT} kill@1:80 train_ddp.py {RESUMING} --out_dir killed",
        cwd=work,
        env=RESTARTABLE,
    )
    assert "failed (exitcode: -9) local_rank: 1" in proc.stderr  # it was killed, and restarted
    assert [r["epoch"] for r in read_metrics(work / "killed")] == [1, 2, 3, 4, 5, 6]
    assert_bit_identical(
        load_checkpoint(clean / "model_epoch_6.pt"), load_checkpoint(work / "killed/model_epoch_6.pt")
    )


def test_a_crash_while_writing_a_checkpoint_leaves_the_previous_one_loadable(work, reference):
    clean = reference(f"{TORCHRUN_2} train_ddp.py {CRASH_RUN}", "clean")
    # rank 0 dies with model_epoch_3.pt half written: the restart resumes from epoch 2
    run(
        f"{TORCHRUN_2} --max-restarts=1 {FAULT} cut@3 train_ddp.py {RESUMING} --out_dir cut",
        cwd=work,
        env=RESTARTABLE,
    )
    assert [r["epoch"] for r in read_metrics(work / "cut")] == [1, 2, 3, 4, 5, 6]
    assert_bit_identical(
        load_checkpoint(clean / "model_epoch_6.pt"), load_checkpoint(work / "cut/model_epoch_6.pt")
    )


def test_a_fresh_run_refuses_an_out_dir_that_holds_checkpoints(work, reference):
    clean = reference(f"{TORCHRUN_2} train_ddp.py {CRASH_RUN}", "clean")
    before = sorted((p.name, p.stat().st_mtime_ns) for p in clean.iterdir())
    proc = run(f"{TORCHRUN_2} train_ddp.py {CRASH_RUN} --out_dir clean", cwd=work, expect=1)
    assert (
        "already holds model_epoch_6.pt" in proc.stderr and "--resume clean/model_epoch_6.pt" in proc.stderr
    )
    assert sorted((p.name, p.stat().st_mtime_ns) for p in clean.iterdir()) == before  # untouched


def test_resuming_an_older_checkpoint_into_a_later_runs_out_dir_is_refused(work, reference):
    reference(f"{TORCHRUN_2} train_ddp.py {CRASH_RUN}", "clean")
    proc = run(
        f"python train_ddp.py {CRASH_RUN} --out_dir clean --resume clean/model_epoch_2.pt", cwd=work, expect=2
    )
    assert "already holds model_epoch_6.pt from an earlier run" in proc.stderr.splitlines()[-1]


@pytest.mark.parametrize(
    "command, out",
    [
        ("python train_ddp.py --batch_size 64", "ws2_to_1"),
        ("torchrun --standalone --nproc_per_node=4 train_ddp.py --batch_size 16", "ws2_to_4"),
    ],
)
def test_a_checkpoint_resumes_at_another_world_size(work, reference, command, out):
    flags = "--epochs 4 --dataset_size 2048"
    full = reference(f"{TORCHRUN_2} train_ddp.py --batch_size 32 {flags}", "ws2_full")
    half = reference(f"{TORCHRUN_2} train_ddp.py --batch_size 32 --epochs 2 --dataset_size 2048", "ws2_half")
    run(f"{command} {flags} --resume {half.name}/model_epoch_2.pt --out_dir {out}", cwd=work)
    assert [r["epoch"] for r in read_metrics(work / out)] == [3, 4]
    assert (
        max_weight_diff(
            load_checkpoint(full / "model_epoch_4.pt"), load_checkpoint(work / out / "model_epoch_4.pt")
        )
        < 1e-5
    )


# 3. Two nodes on one machine -------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("per_node", [1, 2])
def test_two_nodes_on_one_machine_equal_one_node(work, reference, tmp_path, per_node):
    world = 2 * per_node
    flags = f"--epochs 3 --batch_size {64 // world}"
    single = reference(
        f"torchrun --standalone --nproc_per_node={world} train_ddp.py {flags}", f"single{world}"
    )
    out = work / f"nodes2x{per_node}"
    env = audit_env(tmp_path, watch=out)
    command = [*TORCHRUN, "--nnodes=2", f"--nproc_per_node={per_node}", "--rdzv-backend=c10d"]
    command += [f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=twonodes", "train_ddp.py"]
    command += [*flags.split(), "--out_dir", str(out)]
    agents = [
        subprocess.Popen(
            command, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outputs = [agent.communicate(timeout=180) for agent in agents]
    for agent, (stdout, stderr) in zip(agents, outputs, strict=True):
        assert agent.returncode == 0, stdout + stderr
    writers = set(re.findall(r"AUDIT rank=(\S+)", "".join(err for _, err in outputs)))
    assert writers == {"0"}, f"ranks that wrote files: {writers}"
    assert [r["world_size"] for r in read_metrics(out)] == [world] * 3
    assert (
        max_weight_diff(
            load_checkpoint(single / "model_epoch_3.pt"), load_checkpoint(out / "model_epoch_3.pt")
        )
        < 1e-6
    )


# 4. Bad input: one clear line, a non-zero exit, no files, no hang ------------------------


@pytest.fixture(scope="module")
def bad_files(work, reference):
    """Files a user might wrongly pass to --resume."""
    good = (
        reference("python single_gpu_baseline.py --epochs 1 --hidden_size 32", "narrow") / "model_epoch_1.pt"
    )
    bad = work / "bad"
    bad.mkdir()
    (bad / "empty.pt").write_bytes(b"")
    (bad / "cut.pt").write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    (bad / "notes.txt").write_text("not a checkpoint\n")
    torch.save(torch.ones(3), bad / "tensor.pt")
    (bad / "a_file").write_text("")
    torch.save({"epoch": 1, "payload": RunsCode()}, bad / "evil.pt")
    # the right keys, the wrong contents
    fits = reference("python single_gpu_baseline.py --epochs 1", "fits") / "model_epoch_1.pt"
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
    ("--resume bad/wrong_shape.pt", "does not fit this model: size mismatch for 0.weight"),
    ("--resume bad/no_epoch.pt", "not a whole checkpoint"),
    ("--resume bad/bad_momentum.pt", "does not fit this model: a momentum buffer of shape (3,)"),
    ("--out_dir bad/a_file/out", "is not a writable folder"),
    ("--device cuda", "no CUDA GPU"),
    ("--grad_accum_steps 0", "must be a whole number of at least 1"),
    ("--grad_accum_steps 100", "--grad_accum_steps 100 is more than the"),
]


# Under torchrun, one case of each place a refusal is made: the command line, and, once the
# processes have met, the checkpoint (unreadable, unsafe, not fitting) and the data's size.
# The other cases take the same path there; torchrun costs each of them seconds.
TORCHRUN_CASES = (
    "--batch_size 0",
    "--resume bad/empty.pt",
    "--resume bad/evil.pt",
    "--resume bad/wrong_shape.pt",
)
UNDER_TORCHRUN = [case for case in BAD_INPUT if case[0] in (*TORCHRUN_CASES, "--grad_accum_steps 100")]
CASES = [("python", *case) for case in BAD_INPUT] + [("torchrun", *case) for case in UNDER_TORCHRUN]


@pytest.mark.parametrize("launcher, flags, message", CASES, ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_bad_input_gets_one_clear_line_and_no_hang(work, bad_files, launcher, flags, message):
    out = work / "bad_out"
    command = "python train_ddp.py" if launcher == "python" else f"{TORCHRUN_2} train_ddp.py"
    proc = run(
        f"{command} {flags} --out_dir {out}" if "--out_dir" not in flags else f"{command} {flags}",
        cwd=work,
        expect=None,
        timeout=90,
    )
    assert proc.returncode != 0
    errors = [line for line in proc.stderr.splitlines() if line.startswith("train_ddp.py: error:")]
    assert len(errors) == 1 and message in errors[0], proc.stderr  # once, under torchrun too
    assert 'train_ddp.py", line' not in proc.stderr, "the script itself printed a traceback"
    assert not out.exists(), "a failed run left files behind"
    assert not (work / "PWNED").exists()


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


def test_a_worker_that_fails_mid_epoch_ends_the_whole_job(work):
    # rank 1 raises in epoch 2, while rank 0 waits for it in an all-reduce: torchrun
    # stops rank 0 and the job fails at once, well inside the process group's timeout
    proc = run(
        f"{TORCHRUN_2} {FAULT} raise@1:40 train_ddp.py --out_dir failing", cwd=work, expect=1, timeout=50
    )
    assert "injected fault at step 40 of rank 1" in proc.stderr


# Beyond the guide: gradient accumulation and exact evaluation -----------------------------


def test_gradient_accumulation_equals_one_big_batch(reference):
    flags = "--epochs 4 --dataset_size 2048"
    big = reference(f"python single_gpu_baseline.py --batch_size 64 {flags}", "base_2048")
    same_k = reference(
        f"python single_gpu_baseline.py --batch_size 32 --grad_accum_steps 2 {flags}", "base32_k2"
    )
    ddp = reference(f"{TORCHRUN_2} train_ddp.py --batch_size 16 --grad_accum_steps 2 {flags}", "ddp2_k2")
    assert_same_training(big, ddp, epoch=4, tolerance=1e-5)  # 2 processes x 16 x 2 steps = 64
    assert_same_training(same_k, ddp, epoch=4, tolerance=1e-5)  # and the baseline at 2 x 16, K = 2


def test_no_sync_cuts_the_all_reduces_by_k(work):
    counts = {}
    for k in (1, 4):
        command = (
            f"{TORCHRUN_2} {COUNT_ALLREDUCE} train_ddp.py --batch_size 16 --epochs 1 --grad_accum_steps {k}"
        )
        proc = run(f"{command} --out_dir allreduce_k{k}", cwd=work)
        counts[k] = sorted(map(int, re.findall(r"ALLREDUCES rank=\d calls=(\d+)", proc.stderr)))
    assert len(counts[1]) == 2 and counts[1][0] == counts[1][1] > 0, counts
    assert counts[1] == [4 * c for c in counts[4]], counts  # 64 batches: 64 all-reduces, then 16


@pytest.mark.parametrize("nproc, base_batch", [(1, 64), (2, 64), (3, 96)])
def test_val_loss_is_exact_at_any_world_size(reference, nproc, base_batch):
    # 499 held-out samples: no N here divides them, so the sampler pads with repeats
    flags = "--epochs 3 --dataset_size 2016 --val_size 499"
    base = reference(
        f"python single_gpu_baseline.py --batch_size {base_batch} {flags}", f"val_base{base_batch}"
    )
    launcher = f"torchrun --standalone --nproc_per_node={nproc}"
    ddp = reference(f"{launcher} train_ddp.py --batch_size {base_batch // nproc} {flags}", f"val_ddp{nproc}")
    for b, d in zip(read_metrics(base), read_metrics(ddp), strict=True):
        assert abs(b["val_loss"] - d["val_loss"]) <= 1e-6, (b, d)


# 6. Concurrency --------------------------------------------------------------------------


def test_two_standalone_jobs_at_once_both_finish(work):
    jobs = [
        subprocess.Popen(
            [
                *TORCHRUN,
                "--standalone",
                "--nproc_per_node=2",
                "train_ddp.py",
                "--epochs",
                "3",
                "--out_dir",
                f"together{i}",
            ],
            cwd=work,
            env=cpu_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    for job in jobs:
        output, _ = job.communicate(timeout=180)
        assert job.returncode == 0, output
    for i in range(2):  # each wrote its own files, whole
        assert [r["epoch"] for r in read_metrics(work / f"together{i}")] == [1, 2, 3]
    first, second = (load_checkpoint(work / f"together{i}/model_epoch_3.pt") for i in range(2))
    assert_bit_identical(first, second)  # and neither disturbed the other's training
