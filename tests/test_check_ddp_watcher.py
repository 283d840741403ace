"""check_ddp's watcher, in this process: the pieces that must never change what a script does or
blame it for what is not its own. (tests/test_check_ddp.py runs it whole, on scripts.)"""

import ast
import functools
import gc
import sys

import pytest

from check_ddp.judge.crash import needs_gpu
from check_ddp.judge.source import UNDECIDED, decide
from check_ddp.run import PACKAGE, SITECUSTOMIZE
from check_ddp.standin.cuda import CUDA_ANSWERS, CUDA_LEFT, legacy_type, tensor_type
from check_ddp.standin.node import StandIn
from check_ddp.watch.ending import who_raised
from check_ddp.watch.recorder import Beside, Quietly
from check_ddp.watch.registry import PRIVATE, WRAPPERS, missing_names


class Recorded:
    """A watcher's recorder, kept in a list."""

    def __init__(self):
        self.records = []

    def add(self, kind, **fields):
        self.records.append({"e": kind, **fields})


class Watcher:
    def __init__(self):
        self.rec, self.faults = Recorded(), set()


def test_the_watchers_own_error_is_recorded_once_and_never_reaches_the_script():
    w = Watcher()
    for _ in range(3):
        with Quietly(w):
            {}["the watcher's own bookkeeping fails"]
    assert [(r["e"], r["type"]) for r in w.rec.records] == [("fault", "KeyError")]
    assert w.rec.records[0]["at"].startswith("test_check_ddp_watcher.py:")
    with pytest.raises(KeyboardInterrupt), Quietly(w):  # not an error of the watcher's: passed on
        raise KeyboardInterrupt


def raised_in(tmp_path, source):
    """The traceback of an error raised by source, run as a script's file of its own."""
    path = tmp_path / "my_train.py"
    path.write_text(source)
    try:
        exec(compile(source, str(path), "exec"), {})
    except Exception as error:  # noqa: BLE001
        return sys.exc_info()[2], error
    raise AssertionError("no error")


@pytest.mark.parametrize(
    ("source", "who"),
    [
        ("assert 1 == 2, 'needs 2 GPUs'", "raise"),
        ("raise RuntimeError('Requires at least 2 GPUs to run')", "raise"),
        ("len(object())", "call"),  # a call the script made raised inside: not its own raise
        ("import json\njson.loads('{')", "call"),
    ],
)
def test_whose_error_it_is(tmp_path, source, who):
    tb, error = raised_in(tmp_path, source)
    assert who_raised(tb, error) == who


def test_an_error_of_the_checkers_own_code_is_the_checkers():
    try:
        decide(ast.parse("x == 1", mode="eval").body, None)  # value_of None: a TypeError in its code
    except TypeError as error:
        assert who_raised(sys.exc_info()[2], error) == "checker"
    else:
        raise AssertionError("no error")


@pytest.mark.parametrize(
    ("raised", "message", "refused", "stood_in"),
    [
        (
            "call",
            "Cannot get CUDA generator without ATen_cuda library. PyTorch splits its backend",
            False,
            True,
        ),
        ("call", "module 'torch._C' has no attribute '_cuda_setDevice'", False, True),
        ("call", "'StandInProperties' object has no attribute 'L2_cache_size'", False, True),
        ("raise", "Requires at least 2 GPUs to run, but got 1", False, False),  # the script's own check
        # a GPU the node lacks, refused by the stand-in as CUDA does: the script's (its gpu record says so)
        ("checker", "CUDA error: invalid device ordinal (check_ddp: cuda:1 asked, ...)", True, False),
        ("call", "Error(s) in loading state_dict for Net: Missing key(s)", False, False),
    ],
)
def test_what_needs_a_gpu_is_not_checked_and_never_the_scripts(raised, message, refused, stood_in):
    import types

    event = {"type": "RuntimeError", "message": message, "raised": raised}
    facts = types.SimpleNamespace(refused={0: {"refused": "past_node"}} if refused else {})
    assert needs_gpu(facts, 0, event) is stood_in


@pytest.mark.parametrize(
    ("test", "decided"),
    [
        ("args.local_rank == 0", False),
        ("args.local_rank in [-1, 0]", True),
        ("not args.local_rank >= 0", True),
        ("args.local_rank != -1 and later", False),  # decided before the unknown part
        ("later and args.local_rank == 0", "undecided"),
        ("rank == 0", "undecided"),
    ],
)
def test_a_guard_on_an_option_every_rank_holds_alike_is_decided_alike(test, decided):
    def value_of(node):
        is_option = isinstance(node, ast.Attribute) and node.attr == "local_rank"
        return -1 if is_option else UNDECIDED

    result = decide(ast.parse(test, mode="eval").body, value_of)
    assert (result if result is not UNDECIDED else "undecided") == decided


def test_what_the_watcher_knows_of_an_object_is_kept_beside_it_and_goes_with_it():
    import torch

    beside, tensor = Beside(), torch.zeros(3)
    beside.set(tensor, 1)
    assert beside.get(tensor) == 1 and not vars(tensor)  # nothing on the tensor itself
    del tensor
    gc.collect()
    assert not beside.table  # forgotten with it: nothing kept alive, no id reused wrongly


def test_every_name_the_watcher_relies_on_is_in_this_torch():
    """A torch that renames a call the watcher wraps, or a private name it reads, must fail here,
    naming it: the watcher would otherwise skip it, and the rules that read it fall silent."""
    assert missing_names() == []


def test_a_renamed_private_torch_name_fails_with_its_name(monkeypatch):
    from torch.utils.data import dataloader

    monkeypatch.delattr(dataloader._BaseDataLoaderIter, "_next_index")
    monkeypatch.delattr(sys.modules["torch._C"]._nn, "_parse_to")
    assert missing_names() == [
        "torch.utils.data.dataloader._BaseDataLoaderIter._next_index",
        "torch._C._nn._parse_to",
    ]


def test_every_private_name_check_ddp_reads_is_declared():
    """Each private name check_ddp reads of torch's, or of Python's libraries (an attribute `x._name`,
    a getattr of "_name", a dotted torch._private path, and the attributes torch does not document:
    DDP's require_backward_grad_sync) is listed in PRIVATE or wrapped (WRAPPERS): so the tests above
    look it up. Names of its own (self._trees) and Python's frame introspection are not torch's to rename."""
    import ast
    import re

    source = "\n".join(path.read_text() for path in sorted(PACKAGE.rglob("*.py")))
    tree = ast.parse(source)
    own = {  # attributes its code sets on objects of its own
        n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
    }
    python = {"_getframe", "_current_frames", "_exit"}  # sys's and os's, documented
    undocumented = {"require_backward_grad_sync"}
    read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)}
    read |= {  # getattr(x, "_name"), hasattr(x, "_name"), attribute(x, "_name")
        n.args[1].value
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and getattr(n.func, "id", "") in ("getattr", "hasattr", "attribute")
        and len(n.args) > 1
        and isinstance(n.args[1], ast.Constant)
    }
    private = {
        name
        for name in read
        if (name.startswith("_") and not name.startswith("__") or name in undocumented)
        and name not in own | python
    }
    private |= set(re.findall(r"\btorch(?:\.\w+)*\._[a-z]\w*(?:\.\w+)*", source))
    declared = [name.replace("()", "") for name in PRIVATE] + [w.key for w in WRAPPERS]
    undeclared = sorted(
        name
        for name in private
        if not any(
            d.startswith(name) or name.startswith(d) or re.search(rf"[.#]{re.escape(name)}([.#(]|$)", d)
            for d in declared
        )
    )
    # a module checked for before it is read (torch._dynamo), torch's own list named in a comment
    assert set(undeclared) <= {"torch._dynamo", "torch.utils._device", "torch.utils._device.DeviceContext"}, (
        undeclared
    )


# A script watched in one process, without torchrun: check_ddp's watcher and stand-in put in place as
# in a job's worker (by the sitecustomize each worker runs), then the script's calls, then what was
# recorded.
WATCHED = """
import io, os, pickle
from copy import deepcopy

import torch
from torch.utils.data import DataLoader, Sampler, TensorDataset


job_id = os.environ.get("SLURM_JOB_ID") or os.environ["TORCHELASTIC_RUN_ID"]  # a launcher's, each
if os.environ.get("TORCHELASTIC_RUN_ID") is not None:  # read again, on lines of its own
    job_id = os.environ["TORCHELASTIC_RUN_ID"]
home = os.environ.get("HOME")  # no launcher's


class Endless(Sampler):  # no __len__: a DataLoader over it has no length either
    def __iter__(self):
        while True:
            yield from range(8)


torch.cuda.set_device(0)
model = torch.nn.Linear(4, 2).to("cuda")
copy = deepcopy(model)  # an EMA copy: the watcher's hooks stay on the original
pickle.dumps(model)  # a model pickled whole: nothing of the watcher's in it
assert not [k for k in vars(model) if "check" in k], vars(model)
loader = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4, sampler=Endless())
for _, (x,) in zip(range(3), loader):
    model(x.to("cuda"))
torch.save({"w": model.weight}, io.BytesIO())
try:
    torch.Generator(device="cuda")
except RuntimeError as error:
    print("no CUDA generator:", str(error)[:40])
print("done")
"""


def test_the_watcher_and_the_stand_in_in_one_process(tmp_path):
    """Without torchrun: what a script does under the watcher is what it does alone (it finishes,
    prints what it prints), and the records say what it did: the launchers' variables it read (any
    launcher's, found or not, once a line; not torch's own reads), the GPU asked for, the loader with
    no length (none asked of it), the batches, the save to memory."""
    import json
    import os
    import subprocess

    (tmp_path / "my_train.py").write_text(WATCHED)
    job = tmp_path / "job"  # the job's folder, as check_ddp.run makes one: the records, its sitecustomize
    (job / "site").mkdir(parents=True)
    (job / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    env = {
        **os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
        "TORCHELASTIC_RUN_ID": "none", "PYTHONPATH": str(job / "site"),
        "CHECK_DDP_FOLDER": str(job), "CHECK_DDP_TOOL": str(PACKAGE), "CHECK_DDP_STANDIN": "1",
        "CHECK_DDP_STRICT": "1", "CUDA_VISIBLE_DEVICES": "",
    }  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "my_train.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "done" and "no CUDA generator" in proc.stdout
    records = [json.loads(line) for line in (job / "rank0.jsonl").read_text().splitlines()]
    assert not [r for r in records if "sitecustomize" in json.dumps(r)], (
        "the check's own frames as the script's"
    )
    kinds = {}
    for r in records:
        kinds.setdefault(r["e"], []).append(r)
    assert "fault" not in kinds, kinds.get("fault")
    reads = [(r["key"], r["found"], r["by"]) for r in kinds["read"] if r["key"] != "device_count"]
    assert sorted(set(reads)) == [("SLURM_JOB_ID", False, "script"), ("TORCHELASTIC_RUN_ID", True, "script")]
    assert reads.count(("TORCHELASTIC_RUN_ID", True, "script")) == 3, reads  # each line that reads it
    assert {(g["how"], g["index"]) for g in kinds["gpu"]} >= {("set_device", 0), ("model.to", 0), ("to", 0)}
    (loader,) = kinds["loader"]
    assert loader["batches"] is None and loader["sampler"] == "Endless"  # no length asked of the script's
    assert [b["idx"] for b in kinds["batch"][:3]] == [[0, 1, 2, 3], [4, 5, 6, 7], [0, 1, 2, 3]]
    assert [s["path"] for s in kinds["save"]] == [None]  # to memory: no file


# The stand-in and the watcher, apart: what the stand-in knows (its GPUs, the current one, where each
# tensor would be, its hooks) is its own, and reaches the watcher, and the judge, as records only.
SIDES = {"watcher": PACKAGE / "watch", "stand-in": PACKAGE / "standin"}


def section(name):
    """The top-level definitions of one side's modules (watch/, standin/), parsed (check_ddp/worker.py,
    whose watch() makes both, is neither's)."""
    return [node for path in sorted(SIDES[name].glob("*.py")) for node in ast.parse(path.read_text()).body]


def test_the_watcher_reads_nothing_of_the_stand_ins_but_its_records():
    """No code of the watcher's (but watch(), which makes both) names the stand-in or what it keeps
    or answers: its object, its state, its methods, its table of torch.cuda's answers, nor torch.cuda,
    which answers for it. (Its records, through the recorder they share, are how it says anything.)"""
    stand_in = section("stand-in")
    kept = next(node for node in stand_in if getattr(node, "name", "") == "StandIn")
    its = {node.name for node in kept.body if isinstance(node, ast.FunctionDef)} | {
        node.attr
        for node in ast.walk(kept)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self"
    }
    its -= {"__init__", "rec", "faults"}  # the recorder the records go to; Quietly's faults
    names = {node.name for node in stand_in if hasattr(node, "name")} | {
        target.id for node in stand_in if isinstance(node, ast.Assign) for target in node.targets
    }
    read = [
        f"{ast.unparse(node)}, line {node.lineno}"
        for top in section("watcher")
        for node in ast.walk(top)
        if isinstance(node, ast.Attribute)
        and (node.attr in its or ast.unparse(node) == "torch.cuda")
        or isinstance(node, ast.Name)
        and node.id in names
    ]
    assert not read, read


def test_what_the_stand_in_puts_in_torchs_place_is_declared():
    """Everything the stand-in puts in torch's place is declared (stands_in, replaces: WRAPPERS),
    so that missing_names looks it up and the recorder's digest names it: no setattr of its own, no
    assignment to an attribute of a module or class it did not make."""
    own = [
        f"{ast.unparse(node)}, line {node.lineno}"
        for top in section("stand-in")
        for node in ast.walk(top)
        if isinstance(node, ast.Call)
        and ast.unparse(node.func) == "setattr"
        or isinstance(node, (ast.Assign, ast.AugAssign))
        and any(
            isinstance(target, ast.Attribute) and ast.unparse(target).split(".")[0] not in ("self", "s")
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        )
    ]
    assert not own, own
    stood_in = {w.key for w in WRAPPERS if w.standin}
    assert {
        "torch.cuda.is_available",
        "torch.distributed.is_nccl_available",
        "torch.amp.GradScaler",
    } <= stood_in


def test_the_stand_in_answers_as_a_node_of_gpus_and_says_so_in_records():
    """The stand-in alone, in this process: the GPU made current, a tensor "on" it, a GPU its node
    lacks refused as CUDA refuses it; each ask recorded once a way and line, device_count's read once."""
    import torch

    rec = Recorded()
    stand_in = StandIn(rec, node_gpus=2)
    answer = {name: functools.partial(CUDA_ANSWERS[name], stand_in) for name in CUDA_ANSWERS}
    for _ in range(2):
        answer["set_device"]("cuda:1")
        assert answer["device_count"]() == 2
    assert answer["current_device"]() == 1
    with answer["device"](0):
        assert answer["current_device"]() == 0
    assert answer["current_device"]() == 1
    tensor = stand_in.on_gpu(torch.zeros(2), stand_in.index("cuda"))
    assert stand_in.placed(tensor) == "cuda:1" and tensor.device.type == "cpu"
    with pytest.raises(RuntimeError, match="invalid device ordinal .* this node has 2 GPUs"):
        stand_in.ask(2, "to")
    with pytest.raises(RuntimeError):  # torch's own refusal, as on GPUs: passed on, and said
        stand_in.index("cuda:-1")
    said = [(r["e"], r.get("how") or r.get("key"), r.get("index"), r.get("refused")) for r in rec.records]
    assert said == [
        ("gpu", "set_device", 1, None),
        ("read", "device_count", None, None),
        ("gpu", "set_device", 0, None),
        ("gpu", "to", 2, "past_node"),
        ("gpu", "device", None, "invalid"),
    ]


def test_the_stand_in_shows_a_process_the_gpus_it_narrowed_itself_to(monkeypatch):
    """As CUDA does: a process that sets CUDA_VISIBLE_DEVICES to its own GPU before any GPU use sees that
    GPU alone, as cuda:0; the records name the node's GPU (1), so that the judge compares it with
    LOCAL_RANK; a GPU past those it sees is refused, saying why."""
    import torch

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # as the check starts the job on a CPU
    rec = Recorded()
    stand_in = StandIn(rec, node_gpus=2)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the script's, before its first GPU use
    answer = {name: functools.partial(CUDA_ANSWERS[name], stand_in) for name in CUDA_ANSWERS}
    assert answer["device_count"]() == 1 and answer["current_device"]() == 0
    tensor = stand_in.on_gpu(torch.zeros(2), stand_in.ask(stand_in.index("cuda:0"), "to"))
    assert stand_in.placed(tensor) == "cuda:1"
    answer["set_device"](0)
    assert answer["current_device"]() == 0 and stand_in.index("cuda") == 1
    with pytest.raises(RuntimeError, match="cuda:1 asked, and this process sees 1 of its node's 2 GPUs"):
        stand_in.ask(stand_in.index(1), "to")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")  # too late: CUDA read it at its first use
    assert answer["device_count"]() == 1 and stand_in.index("cuda:0") == 1


def test_every_public_name_of_torch_cuda_is_stood_in_or_left_to_torch_with_a_reason():
    """torch.cuda as a whole, enumerated from torch itself, not from the scripts seen so far: each public
    name is answered by the stand-in, or declared left to torch (CUDA_LEFT, with why), so that an old or
    rare GPU call never empties a check by surprise, and a torch that adds one fails here, naming it."""
    import torch

    stood_in = {w.name for w in WRAPPERS if w.standin and w.owner == "torch.cuda"}
    assert not stood_in & set(CUDA_LEFT), "a name both stood in and left"
    missing = sorted(set(torch.cuda.__all__) - stood_in - set(CUDA_LEFT))
    assert not missing, f"torch.cuda's public names neither stood in nor left with a reason: {missing}"


def test_the_legacy_gpu_tensor_types_stand_in_as_an_older_script_uses_them():
    """torch.cuda.FloatTensor(...), x.type(torch.cuda.LongTensor), isinstance(x, torch.cuda.FloatTensor)
    and x.type() as an older script uses them: a CPU tensor of the type's dtype, on the current GPU."""
    import torch

    rec = Recorded()
    stand_in = StandIn(rec, node_gpus=2)
    types_ = {k: legacy_type(None, stand_in, f"{k}Tensor") for k in ("Float", "Long")}
    to_type = tensor_type(torch.Tensor.type, stand_in, "type")
    made = types_["Float"](2, 3)
    assert made.dtype == torch.float32 and made.shape == (2, 3) and stand_in.placed(made) == "cuda:0"
    assert isinstance(made, types_["Float"]) and not isinstance(torch.zeros(1), types_["Float"])
    cast = to_type(made, types_["Long"])
    assert cast.dtype == torch.int64 and stand_in.placed(cast) == "cuda:0"
    assert to_type(cast) == "torch.cuda.LongTensor" and to_type(torch.zeros(1)) == "torch.FloatTensor"
    assert to_type(torch.zeros(1), "torch.cuda.DoubleTensor").dtype == torch.float64
