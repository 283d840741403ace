"""The twin scripts run as the README says, train, and write what other tools read."""

import ast
import difflib
import io
import re
import sys
import tokenize

import pytest
import torch
from helpers import (
    ROOT,
    SCRIPTS,
    baseline_run,
    copy_scripts,
    cpu_env,
    ddp_run,
    load_checkpoint,
    max_weight_diff,
    read_metrics,
    run,
)
from torch.utils.data import DistributedSampler, RandomSampler

METRIC_KEYS = {"epoch", "loss", "samples", "seconds", "samples_per_sec", "world_size", "backend", "device"}


def check_metrics(out_dir, epochs, world_size, samples):
    """metrics.jsonl: one well-formed line per epoch, written once, and the loss falls."""
    records = read_metrics(out_dir)
    assert [r["epoch"] for r in records] == list(range(1, epochs + 1))
    for r in records:
        assert METRIC_KEYS <= r.keys()
        assert r["world_size"] == world_size
        assert r["samples"] == samples
        assert r["seconds"] > 0 and r["samples_per_sec"] > 0
        assert r["device"] == "cpu"
    assert records[-1]["loss"] <= records[0]["loss"] / 2, [r["loss"] for r in records]
    return records


README = (ROOT / "README.md").read_text()


def readme_command(start):
    """The command of the README's "Run it" that starts so, its comment left out."""
    block = re.search(r"^## Run it\n+```bash\n(.*?)```", README, flags=re.S | re.M).group(1)
    (command,) = [line.split("#")[0].strip() for line in block.splitlines() if line.startswith(start)]
    return command


def baseline_default_run(shared_run):
    """The README's baseline command, made once for the tests that read it."""
    return shared_run(readme_command("python single_gpu_baseline.py"))


def default_run(shared_run, nproc):
    """The README's torchrun command, the baseline's twin, at nproc processes, made once for the tests
    that read it: with every worker's writes reported (helpers.audit_env), and its output both on the
    console and in a log per rank, logs/<run id>/attempt_0/<local rank>/std{out,err}.log (--tee,
    --log-dir)."""
    command = readme_command("torchrun --standalone --nproc_per_node=2 train_ddp.py")
    options = f"--nproc_per_node={nproc} --tee=3 --log-dir=logs"
    return shared_run(command.replace("--nproc_per_node=2", options), audit=True)


def test_baseline_runs_and_learns(shared_run):
    base = baseline_default_run(shared_run)
    assert base.out == base.folder / "out/single_gpu_baseline/run_1"
    records = check_metrics(base.out, epochs=5, world_size=1, samples=2048)
    assert records[0]["backend"] is None
    lines = base.proc.stdout.splitlines()
    assert lines[0] == "single_gpu_baseline.py: writing to out/single_gpu_baseline/run_1"
    assert len(lines) == 6  # where the run goes, then one line per epoch


def test_the_readmes_torchrun_command_is_the_baselines_twin(shared_run):
    # 2 processes of 32 against one of 64: the same global batches, the same losses to float rounding
    base, ddp = baseline_default_run(shared_run), default_run(shared_run, 2)
    pairs = list(zip(read_metrics(base.out), read_metrics(ddp.out), strict=True))
    assert all(a["samples"] == b["samples"] and b["world_size"] == 2 for a, b in pairs)
    gaps = [abs(a[key] - b[key]) / a[key] for a, b in pairs for key in ("loss", "val_loss")]
    assert max(gaps) < 1e-4, gaps


def test_checkpoints_come_when_the_pages_say(shared_run):
    # every --save_interval epochs and after the last: the README and docs/runs-and-restarts.md say
    # so, --help gives the interval's default, and both scripts save at those epochs
    claim = "every `--save_interval` epochs and after the last"
    assert claim in README and claim in (ROOT / "docs/runs-and-restarts.md").read_text()
    shown = " ".join(run([sys.executable, "single_gpu_baseline.py", "--help"], cwd=ROOT).stdout.split())
    said = re.search(
        r"--save_interval \w+ checkpoint every N epochs, and after the last \(default: (\d+)\)", shown
    )
    interval = int(said.group(1))
    epochs = 5  # the default runs'
    expected = [f"model_epoch_{e}.pt" for e in range(1, epochs + 1) if e % interval == 0 or e == epochs]
    for made in (baseline_default_run(shared_run), default_run(shared_run, 2)):
        assert sorted(p.name for p in made.out.glob("*.pt")) == expected, made.out


def flags(script):
    """The --flags a script's parser takes, read from its code."""
    calls = [node for node in ast.walk(ast.parse((ROOT / script).read_text())) if isinstance(node, ast.Call)]
    return {
        call.args[0].value
        for call in calls
        if getattr(call.func, "attr", None) == "add_argument" and isinstance(call.args[0], ast.Constant)
    }


def test_the_flags_each_twin_takes_are_as_the_pages_say():
    page = (ROOT / "docs/runs-and-restarts.md").read_text()
    only = re.search(r"take the same flags\s+but one: `(--\w+)`, the DDP twin's alone", page)
    assert only, "docs/runs-and-restarts.md no longer says which flags the twins share"
    baseline, ddp = flags("single_gpu_baseline.py"), flags("train_ddp.py")
    assert len(baseline) >= 10 and baseline <= ddp
    assert ddp - baseline == {only.group(1)}
    assert flags("train_fsdp.py") == baseline, "docs/fsdp.md: the FSDP twin takes the baseline's flags"


def test_the_baselines_sampler_maps_to_set_epoch_as_the_readme_says():
    # "Your turn": RandomSampler, its generator reseeded with seed + epoch, becomes DistributedSampler(seed)
    # with set_epoch(epoch); every line the README shows for it is in one of the twins
    turn = re.search(r"^### Your turn\n(.*?)^###", README, flags=re.S | re.M).group(1)
    spans = [span for span in re.findall(r"`([^`]+)`", turn) if "ampler" in span]
    assert len(spans) >= 4, spans
    twins = [(ROOT / script).read_text() for script in SCRIPTS]
    assert [span for span in spans if not any(span in text for text in twins)] == []
    n, seed, world = 12, 7, 3
    for epoch in range(3):
        generator = torch.Generator().manual_seed(seed + epoch)  # the baseline's, reseeded
        order = list(RandomSampler(range(n), generator=generator))
        for rank in range(world):
            shard = DistributedSampler(range(n), num_replicas=world, rank=rank, seed=seed)
            shard.set_epoch(epoch)
            assert list(shard) == order[rank::world], (epoch, rank)  # every N-th index of that order


@pytest.mark.parametrize("nproc", [pytest.param(1, marks=pytest.mark.slow), 2])
def test_torchrun_runs_and_learns(shared_run, nproc):
    ddp = default_run(shared_run, nproc)
    assert ddp.out == ddp.folder / "out/train_ddp/run_1"
    records = check_metrics(ddp.out, epochs=5, world_size=nproc, samples=2048)
    assert records[0]["backend"] == "gloo"
    assert ddp.proc.stdout.count("epoch ") == 5  # rank 0 alone prints, once an epoch


@pytest.mark.slow
def test_the_guides_own_command_twice_goes_into_two_folders(tmp_path):
    command = "torchrun --standalone --nproc_per_node=2 train_ddp.py --epochs 10 --batch_size 32"
    for n in (1, 2):  # a command run again is a new run, in a new folder, and says where
        proc = run(command, cwd=copy_scripts(tmp_path))
        assert f"train_ddp.py: writing to out/train_ddp/run_{n}\n" in proc.stdout
        check_metrics(tmp_path / f"out/train_ddp/run_{n}", epochs=10, world_size=2, samples=2048)
    first, second = (load_checkpoint(tmp_path / f"out/train_ddp/run_{n}/model_epoch_10.pt") for n in (1, 2))
    assert max_weight_diff(first, second) == 0  # the same training, twice


@pytest.mark.slow
def test_resume_auto_without_out_dir_continues_the_latest_run(tmp_path):
    work = copy_scripts(tmp_path)
    run("python train_ddp.py --epochs 2", cwd=work)
    proc = run("python train_ddp.py --epochs 3 --resume auto", cwd=work)
    assert "train_ddp.py: writing to out/train_ddp/run_1\n" in proc.stdout
    assert [r["epoch"] for r in read_metrics(work / "out/train_ddp/run_1")] == [1, 2, 3]
    assert not (work / "out/train_ddp/run_2").exists()


def test_python_without_torchrun_is_a_one_process_job(tmp_path):
    # its group of one meets at a file that mkstemp makes (never mktemp's name, which another process
    # can take first), in the temporary folder, and that file is gone once the group is
    (tmp_path / "tmp").mkdir()
    env = {
        k: v
        for k, v in cpu_env(TMPDIR=str(tmp_path / "tmp")).items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")
    }
    proc = run("python train_ddp.py", cwd=copy_scripts(tmp_path), env=env)
    assert proc.stdout.splitlines()[0].startswith("train_ddp.py: not started by torchrun")
    check_metrics(tmp_path / "out/train_ddp/run_1", epochs=5, world_size=1, samples=2048)
    left = list((tmp_path / "tmp").glob("train_ddp-group-*"))  # torch keeps caches of its own there
    assert left == [], "the one-process group left its file behind"
    assert "mktemp(" not in (ROOT / "train_ddp.py").read_text()


def code_lines(path):
    """A script's lines of code: its comments, docstrings and blank lines left out."""
    return [line for _, line in numbered_code_lines(path)]


def numbered_code_lines(path):
    """code_lines(path), each with its line number in the script: [(number, line), ...]."""
    source = path.read_text()
    drop, cut, previous = set(), {}, None
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            cut[token.start[0]] = token.start[1]
            continue
        statement_start = previous is None or previous.type in (
            tokenize.NEWLINE,
            tokenize.INDENT,
            tokenize.DEDENT,
        )
        if token.type == tokenize.STRING and statement_start:  # a docstring, or a string alone
            drop.update(range(token.start[0], token.end[0] + 1))
        if token.type not in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
            previous = token
    lines = (
        (n, line[: cut.get(n, len(line))].rstrip())
        for n, line in enumerate(source.splitlines(), 1)
        if n not in drop
    )
    return [(n, line) for n, line in lines if line.strip()]


def added_code_lines(old, new):
    """The lines of code that `diff -u old new` adds (its comments, docstrings and blank lines aside)."""
    added = difflib.unified_diff(code_lines(ROOT / old), code_lines(ROOT / new), lineterm="", n=0)
    return [line for line in added if line[:1] == "+" and not line.startswith("+++")]


def test_the_twin_diff_adds_at_most_45_lines_of_code():
    # the conversion, and what every conversion does not need kept out of its way (tagged optional,
    # or in the plumbing both scripts share): a diff a learner reads in one sitting
    added = added_code_lines("single_gpu_baseline.py", "train_ddp.py")
    assert 30 < len(added) <= 45, "\n".join(added)


def test_the_fsdp_twin_diff_adds_at_most_55_lines_of_code():
    # what FSDP2 changes of the DDP twin (docs/fsdp.md), its workarounds included. Issue 46 aimed at 40;
    # the model built on the meta device, DCP's sharded save and load, a whole file read by rank 0 alone,
    # its optimizer state renamed by the optimizer's own order, and what a complete checkpoint is (a
    # .pt file, or a folder once DCP wrote its .metadata) take 55
    added = added_code_lines("train_ddp.py", "train_fsdp.py")
    assert 20 < len(added) <= 55, "\n".join(added)


def test_only_rank_0_writes_files_or_prints(shared_run):
    ddp = default_run(shared_run, 2)
    by_rank = {}
    for log in (ddp.folder / "logs").rglob("std*.log"):  # logs/<run id>/attempt_0/<local rank>/...
        by_rank.setdefault(int(log.parent.name), []).append(log.read_text())
    rank0, rank1 = "".join(by_rank[0]), "".join(by_rank[1])
    assert "AUDIT rank=0 open" in rank0 and "metrics.jsonl" in rank0  # the hook does see writes
    assert "AUDIT rank=0 os.rename" in rank0 and "model_epoch_5.pt" in rank0
    assert rank1 == "", f"rank 1 wrote or printed:\n{rank1}"
    assert len(read_metrics(ddp.out)) == 5


def test_checkpoints_are_plain_data_of_the_unwrapped_model(shared_run):
    ddp = default_run(shared_run, 2)
    files = sorted(p.name for p in ddp.out.iterdir())
    # nothing half-written left behind (when each is saved: test_checkpoints_come_when_the_pages_say)
    assert [name for name in files if not name.startswith("model_epoch_")] == [".lock", "metrics.jsonl"]
    checkpoint = load_checkpoint(ddp.out / "model_epoch_5.pt")  # weights_only=True
    assert checkpoint["epoch"] == 5
    assert {"model_state_dict", "optimizer_state_dict", "config"} <= checkpoint.keys()
    assert not any(k.startswith("module.") for k in checkpoint["model_state_dict"])
    assert checkpoint["optimizer_state_dict"]["state"], "momentum buffers are needed for an exact resume"


@pytest.mark.slow
def test_resume_continues_at_the_next_epoch_across_scripts_and_world_sizes(shared_run, tmp_path):
    # 2 processes at batch 32 for 4 epochs, and for 2; the baseline at batch 64 for 4 (test_proofs
    # compares the same runs): each saved epoch 2 (--save_interval 2)
    ddp_4, ddp_2, base_4 = shared_run(ddp_run(2), ddp_run(2, epochs=2), baseline_run())
    full = load_checkpoint(ddp_4.out / "model_epoch_4.pt")

    # the same script and world size, in the 2-epoch run's own folder: continues from epoch 3, bit for bit
    work = ddp_2.copy_to(tmp_path / "part")
    part = ddp_2.out.relative_to(ddp_2.folder)
    run(f"{ddp_run(2)} --out_dir {part} --resume {part}/model_epoch_2.pt", cwd=work)
    assert [r["epoch"] for r in read_metrics(work / part)] == [1, 2, 3, 4]
    resumed = load_checkpoint(work / part / "model_epoch_4.pt")
    assert resumed["epoch"] == 4
    for key, value in full["model_state_dict"].items():
        assert torch.equal(value, resumed["model_state_dict"][key]), key

    # DDP at 2 x 32 -> baseline at 64, and baseline -> DDP: the same training, to rounding
    work = copy_scripts(tmp_path)
    run(f"{baseline_run()} --out_dir to_base --resume {ddp_2.out}/model_epoch_2.pt", cwd=work)
    assert [r["epoch"] for r in read_metrics(work / "to_base")] == [3, 4]
    assert max_weight_diff(full, load_checkpoint(work / "to_base/model_epoch_4.pt")) < 1e-5
    run(f"{ddp_run(2)} --out_dir from_base --resume {base_4.out}/model_epoch_2.pt", cwd=work)
    assert max_weight_diff(full, load_checkpoint(work / "from_base/model_epoch_4.pt")) < 1e-5


# the baseline's; train_ddp.py's are among test_proofs' bad-input cases, which assert all this and more
@pytest.mark.parametrize(
    "flags, message",
    [
        ("--batch_size 0", "must be a whole number of at least 1"),
        ("--lr nan", "must be a finite number above 0"),
        ("--resume missing.pt", "no such file"),
    ],
)
def test_bad_input_gets_one_clear_line(tmp_path, flags, message):
    proc = run(f"python single_gpu_baseline.py {flags}", cwd=copy_scripts(tmp_path), expect=2)
    assert message in proc.stderr.splitlines()[-1]
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_help_states_defaults():
    proc = run([sys.executable, "train_ddp.py", "--help"], cwd=ROOT)
    assert "(default: 64)" in proc.stdout and "--hidden_size" in proc.stdout


# What native Windows lacks: fcntl (Unix only), and torch.distributed.HashStore (not exported on win32).
AS_ON_WINDOWS = """
import importlib.abc, sys

class NoFcntl(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "fcntl":
            raise ModuleNotFoundError("No module named 'fcntl'", name=name)

sys.meta_path.insert(0, NoFcntl())
import torch.distributed
del torch.distributed.HashStore
"""


@pytest.mark.slow
def test_the_scripts_run_without_fcntl_and_hashstore_as_on_windows(tmp_path):
    for script in SCRIPTS:  # anywhere in it, `import fcntl` or `from fcntl import ...`
        tree = ast.parse((ROOT / script).read_text())
        imported = {
            alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
        }
        imported |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert "fcntl" not in imported, f"{script} imports fcntl, which Windows lacks"
    (tmp_path / "site").mkdir()
    (tmp_path / "site/sitecustomize.py").write_text(AS_ON_WINDOWS)
    env = cpu_env(PYTHONPATH=str(tmp_path / "site"))
    work = copy_scripts(tmp_path)
    probe = "import torch.distributed as d; assert not hasattr(d, 'HashStore'); import fcntl"
    assert "No module named 'fcntl'" in run([sys.executable, "-c", probe], cwd=work, env=env, expect=1).stderr
    for command in (
        "python single_gpu_baseline.py --epochs 2",
        "python train_ddp.py --epochs 2",
        "torchrun --standalone --nproc_per_node=2 train_ddp.py --epochs 2",
    ):
        run(command, cwd=work, env=env)
    for folder in ("single_gpu_baseline/run_1", "train_ddp/run_1", "train_ddp/run_2"):
        assert [r["epoch"] for r in read_metrics(work / "out" / folder)] == [1, 2], folder
