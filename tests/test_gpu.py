"""The twins on GPUs, with nccl, through the real entry points: what the CPU tests prove,
proved again where DDP is meant to run. Every test is marked `gpu` and sized to the GPUs
present (one process per GPU); on a machine without CUDA, every one is skipped.

    python -m pytest -m gpu tests/test_gpu.py        # or: bash benchmarks/gpu_checks.sh
"""

import math
import os
import re

import pytest
import torch
from helpers import (
    ROOT,
    audit_env,
    copy_scripts,
    load_checkpoint,
    max_weight_diff,
    read_metrics,
    run,
)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

GPUS = torch.cuda.device_count()
SYNC_DEBUG = ROOT / "tests" / "sync_debug.py"
FLAGS = "--epochs 4 --dataset_size 2048"  # 2048 = 64 x 32: every N here divides each batch of 64
# The CPU tests hold the twins to 1e-5. On a GPU, cuBLAS picks its kernels, and so the
# order in which they sum, by matrix shape: one batch of 64 and N batches of 64/N round
# differently, and nccl sums the gradients in an order of its own. Each difference is
# a float32 rounding (matmuls stay in full float32: torch's default precision "highest",
# no TF32), but they compound over the 128 steps of FLAGS, with momentum. 1e-4 gives
# them 10x the CPU's room, and is still the size of a real difference: two samples
# repeated each epoch move the weights by more than 1e-4 (test_proofs.py, padding).
TOLERANCE = 1e-4


def gpu_env(env=None, **extra):
    """env (by default this one), with the GPUs of this machine visible: helpers.run pins
    the processes it starts to the CPU unless it is given an environment."""
    env = dict(os.environ if env is None else env, **extra)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        env["CUDA_VISIBLE_DEVICES"] = os.environ["CUDA_VISIBLE_DEVICES"]
    return env


def needs(nproc):
    if nproc > GPUS:
        pytest.skip(f"needs {nproc} GPUs, this machine has {GPUS}")


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """One folder for the module's runs, so that reference runs are made once."""
    return copy_scripts(tmp_path_factory.mktemp("gpu"))


@pytest.fixture(scope="module")
def reference(work):
    """Run a command once per module (--out_dir named after it); return its output folder."""
    done = {}

    def make(command, name):
        if name not in done:
            run(f"{command} --out_dir {name}", cwd=work, env=gpu_env())
            done[name] = work / name
        return done[name]

    return make


def assert_same_training(a, b, epoch=4):
    diff = max_weight_diff(
        load_checkpoint(a / f"model_epoch_{epoch}.pt"), load_checkpoint(b / f"model_epoch_{epoch}.pt")
    )
    assert diff <= TOLERANCE, f"weights differ by {diff:.2e}"
    losses = [(x["loss"], y["loss"]) for x, y in zip(read_metrics(a), read_metrics(b), strict=True)]
    assert max(abs(x - y) for x, y in losses) <= TOLERANCE, losses


def gpu_baseline(reference):
    return reference(f"python single_gpu_baseline.py --device cuda --batch_size 64 {FLAGS}", "base_cuda")


def ddp_on_gpus(reference, nproc):
    launcher = f"torchrun --standalone --nproc_per_node={nproc}"
    return reference(
        f"{launcher} train_ddp.py --device cuda --batch_size {64 // nproc} {FLAGS}", f"ddp{nproc}"
    )


# 1. Equivalence on nccl ------------------------------------------------------------------


@pytest.mark.parametrize("nproc", [1, 2, 4, 8])
def test_n_gpus_equal_the_baseline_at_n_times_the_batch(reference, nproc):
    needs(nproc)
    base, ddp = gpu_baseline(reference), ddp_on_gpus(reference, nproc)
    assert {(r["backend"], r["device"], r["world_size"]) for r in read_metrics(ddp)} == {
        ("nccl", "cuda:0", nproc)
    }
    assert all(r["device"].startswith("cuda") for r in read_metrics(base))
    assert_same_training(base, ddp)


# 2. Checkpoints move between devices and world sizes --------------------------------------


def resume_and_compare(work, command, saved, out):
    """Resume the run in saved at epoch 3 with command: it must end where that run ended."""
    run(f"{command} {FLAGS} --resume {saved.name}/model_epoch_2.pt --out_dir {out}", cwd=work, env=gpu_env())
    records = read_metrics(work / out)
    assert [r["epoch"] for r in records] == [3, 4]
    final = "model_epoch_4.pt"
    assert max_weight_diff(load_checkpoint(saved / final), load_checkpoint(work / out / final)) <= TOLERANCE
    return records[-1]


def saved_on(path):
    """The device types a checkpoint's tensors were saved from. torch.load hands each storage's
    saved location ("cuda:0", "cpu") to a map_location callable; this one keeps every storage
    on the CPU, so that this process never starts CUDA for the rest of the session."""
    locations = set()

    def on_the_cpu(storage, location):
        locations.add(location.split(":")[0])
        return storage  # as read from the file: on the CPU

    torch.load(path, map_location=on_the_cpu, weights_only=True)
    return locations


def test_a_checkpoint_saved_on_a_gpu_resumes_on_the_cpu(work, reference):
    saved = gpu_baseline(reference)
    assert saved_on(saved / "model_epoch_2.pt") == {"cuda"}
    on_cpu = "torchrun --standalone --nproc_per_node=2 train_ddp.py --device cpu --batch_size 32"
    assert resume_and_compare(work, on_cpu, saved, "gpu_to_cpu")["device"] == "cpu"


def test_a_checkpoint_saved_on_the_cpu_resumes_on_a_gpu(work, reference):
    on_cpu = "torchrun --standalone --nproc_per_node=2 train_ddp.py --device cpu --batch_size 32"
    saved = reference(f"{on_cpu} {FLAGS}", "ddp2_cpu")
    assert saved_on(saved / "model_epoch_2.pt") == {"cpu"}
    on_gpu = "python train_ddp.py --device cuda --batch_size 64"
    assert resume_and_compare(work, on_gpu, saved, "cpu_to_gpu")["device"] == "cuda:0"


def test_a_checkpoint_of_two_gpus_resumes_on_one(work, reference):
    needs(2)
    saved = ddp_on_gpus(reference, 2)
    on_one_gpu = "python train_ddp.py --device cuda --batch_size 64"
    assert resume_and_compare(work, on_one_gpu, saved, "two_to_one")["world_size"] == 1


# 3. No host synchronisation inside a training step ---------------------------------------


def optimizer_steps(nproc, grad_accum_steps):
    """Optimizer steps a rank makes in an epoch of the default 2048 samples at batch 64."""
    return math.ceil(math.ceil(2048 / nproc / 64) / grad_accum_steps)


def sync_debug_counts(stderr):
    """(checked steps, checked batches, unpinned batches), one per rank, as sync_debug.py reports them."""
    found = re.findall(
        r"SYNC_DEBUG rank=\d+ checked_steps=(\d+) checked_batches=(\d+) unpinned_batches=(\d+)", stderr
    )
    return [tuple(map(int, counts)) for counts in found]


@pytest.mark.parametrize("nproc, grad_accum_steps", [(1, 1), (2, 1), (2, 4)])
def test_a_training_step_never_waits_for_the_gpu(work, nproc, grad_accum_steps):
    needs(nproc)
    epochs = 3
    command = f"torchrun --standalone --nproc_per_node={nproc} {SYNC_DEBUG} train_ddp.py --device cuda"
    flags = (
        f"--epochs {epochs} --grad_accum_steps {grad_accum_steps} --out_dir sync{nproc}_{grad_accum_steps}"
    )
    proc = run(f"{command} {flags}", cwd=work, env=gpu_env())
    checked = sync_debug_counts(proc.stderr)
    # every step of every epoch but its first, and but the run's second (sync_debug.py)
    steps = epochs * (optimizer_steps(nproc, grad_accum_steps) - 1) - 1
    # each of them K micro-batches from the loader, and every one of those pinned
    assert checked == [(steps, grad_accum_steps * steps, 0)] * nproc, proc.stderr


def test_the_sync_check_catches_an_item_per_step(work):
    """The guide's .item() each step, done inside the window: the run must fail."""
    command = (
        f"torchrun --standalone --nproc_per_node=1 {SYNC_DEBUG} train_ddp.py --device cuda --out_dir canary"
    )
    proc = run(command, cwd=work, env=gpu_env(SYNC_DEBUG_CANARY="item"), expect=1)
    assert "called a synchronizing CUDA operation" in proc.stderr


def test_the_pinning_check_catches_a_loader_without_pin_memory(work):
    """A loader without pin_memory, inside the window: sync-debug mode lets the run pass, as torch
    raises nothing for a non_blocking copy from pageable memory, and the pinning check reports
    every batch it checked."""
    command = f"torchrun --standalone --nproc_per_node=1 {SYNC_DEBUG} train_ddp.py --device cuda"
    proc = run(
        f"{command} --epochs 2 --out_dir unpinned", cwd=work, env=gpu_env(SYNC_DEBUG_CANARY="unpinned")
    )
    steps = 2 * (optimizer_steps(1, 1) - 1) - 1
    assert sync_debug_counts(proc.stderr) == [(steps, steps, steps)], proc.stderr


# 4. Only rank 0 writes files -------------------------------------------------------------


def test_only_rank_0_writes_files_or_prints(tmp_path):
    needs(2)
    work = copy_scripts(tmp_path)
    env = gpu_env(audit_env(tmp_path, watch=work / "out"))
    logs = tmp_path / "logs"
    command = f"torchrun --standalone --nproc_per_node=2 --redirects=3 --log-dir={logs} train_ddp.py"
    run(f"{command} --device cuda --out_dir out/audited", cwd=work, env=env)
    by_rank = {}
    for log in logs.rglob("std*.log"):  # logs/<run id>/attempt_0/<local rank>/std{out,err}.log
        by_rank.setdefault(int(log.parent.name), []).append(log.read_text())
    rank0, rank1 = "".join(by_rank[0]), "".join(by_rank[1])
    assert "AUDIT rank=0 open" in rank0 and "metrics.jsonl" in rank0  # the hook does see writes
    assert "AUDIT rank=0 os.rename" in rank0 and "model_epoch_5.pt" in rank0
    assert rank1 == "", f"rank 1 wrote or printed:\n{rank1}"
    assert {r["backend"] for r in read_metrics(work / "out/audited")} == {"nccl"}


# 5. FSDP2 on GPUs: nccl, float32 as the baseline computes (mixed precision is a choice of its own) ------


def fsdp_on_gpus(reference, nproc):
    launcher = f"torchrun --standalone --nproc_per_node={nproc}"
    return reference(
        f"{launcher} train_fsdp.py --device cuda --batch_size {64 // nproc} {FLAGS}", f"fsdp{nproc}"
    )


@pytest.mark.parametrize("nproc", [1, 2, 4])
def test_fsdp_on_n_gpus_equals_the_baseline_at_n_times_the_batch(reference, nproc):
    """train_fsdp.py computes in float32, as the baseline does (docs/fsdp.md shows bfloat16 as a choice
    of its own): on N GPUs at batch 64/N it ends with the baseline's weights and losses at 64, to the
    GPU tolerance DDP's proof has, its model built on the meta device and drawn block by block on the
    CPU, as the baseline draws it."""
    needs(nproc)
    base, fsdp = gpu_baseline(reference), fsdp_on_gpus(reference, nproc)
    records = read_metrics(fsdp)
    assert {(r["backend"], r["device"], r["world_size"]) for r in records} == {("nccl", "cuda:0", nproc)}
    assert_same_training(base, fsdp)
    weights = load_checkpoint(fsdp / "model_epoch_4.pt")
    assert {t.dtype for t in weights["model_state_dict"].values()} == {torch.float32}


def test_fsdps_checkpoints_saved_on_a_gpu_resume_on_the_cpu(work, reference):
    """FSDP step 6 across devices: the sharded checkpoint model_epoch_2, saved on a GPU, resumes in
    train_fsdp.py on the CPU, at another world size (2 processes, gloo), and ends where the GPU run
    ended; the last epoch's whole file, gathered onto the CPU (cpu_offload), resumes in the DDP twin
    on the CPU, at its next epoch."""
    saved = fsdp_on_gpus(reference, 1)
    on_cpu = "torchrun --standalone --nproc_per_node=2 {} --device cpu --batch_size 32"
    run(
        f"{on_cpu.format('train_fsdp.py')} {FLAGS} --resume {saved.name}/model_epoch_2 --out_dir fsdp_to_cpu",
        cwd=work,
        env=gpu_env(),
    )
    assert [r["epoch"] for r in read_metrics(work / "fsdp_to_cpu")] == [3, 4]
    final = load_checkpoint(saved / "model_epoch_4.pt")
    assert max_weight_diff(final, load_checkpoint(work / "fsdp_to_cpu/model_epoch_4.pt")) <= TOLERANCE
    assert saved_on(saved / "model_epoch_4.pt") == {"cpu"}  # gathered with cpu_offload: on the CPU
    more = FLAGS.replace("--epochs 4", "--epochs 5")
    run(
        f"{on_cpu.format('train_ddp.py')} {more} --resume {saved.name}/model_epoch_4.pt --out_dir whole_cpu",
        cwd=work,
        env=gpu_env(),
    )
    assert [r["epoch"] for r in read_metrics(work / "whole_cpu")] == [5]
