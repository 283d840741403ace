"""How a process ends: its own error (where, raised by whom, in which watched call), or its last record
(the replicas' weights, what it evaluated, the files it wrote and imported)."""

import ast
import functools
import os
import sys
from pathlib import Path

from .evidence import ends, is_empty, local, weights_summary
from .files import observe_writes
from .frames import OURS, is_ours, is_users
from .recorder import Quietly
from .registry import CALL_OF_CODE


def excepthook(w, previous_hook, kind, error, tb):
    with Quietly(w):
        record_crash(w, kind, error, tb)
    previous_hook(kind, error, tb)


def record_crash(w, kind, error, tb):
    import traceback

    frames = traceback.extract_tb(tb)
    users = [f for f in frames if is_users(f.filename)]
    call, walk, within = None, tb, False
    while walk is not None:  # the innermost watched call, and whether the script's code ran inside it
        if walk.tb_frame.f_code in CALL_OF_CODE:
            call, within = CALL_OF_CODE[walk.tb_frame.f_code], False
        elif call is not None and is_users(walk.tb_frame.f_code.co_filename):
            within = True
        walk = walk.tb_next
    w.rec.add(
        "crash",
        type=kind.__name__,
        message=ends(str(error).strip()),
        at=f"{os.path.relpath(users[-1].filename)}:{users[-1].lineno}" if users else None,
        by_script=bool(frames) and is_users(frames[-1].filename),
        call=call,
        loader=w.state["pass"] and w.state["pass"]["loader"],
        raised=who_raised(tb, error),
        path=os.path.realpath(os.fsdecode(error.filename))
        if isinstance(error, OSError) and isinstance(error.filename, (str, bytes))
        else None,
        program=missing_program(frames, error),
        within=within,
    )


def missing_program(frames, error):
    """The program the script ran that this machine lacks: a FileNotFoundError raised as subprocess
    started it (nvidia-smi on a machine without GPUs, git where none is installed), or None."""
    started = any(f.name == "_execute_child" and f.filename.endswith("subprocess.py") for f in frames)
    if isinstance(error, FileNotFoundError) and started:
        return os.path.basename(os.fsdecode(error.filename)) if error.filename else "a program"
    return None


def who_raised(tb, error):
    """Whose code raised an error: "raise", a raise or assert statement of the script's; "checker",
    this check's own code (not a call it passes on, nor a GPU error it acts out for the stand-in);
    "call", a call the script made (into torch, a library, or its own C code)."""
    import dis

    while tb.tb_next is not None:
        tb = tb.tb_next
    code, line = tb.tb_frame.f_code, tb.tb_lineno
    if is_ours(code.co_filename):
        path = os.path.realpath(code.co_filename)
        return "call" if any(a <= line <= b for a, b in passed_on().get(path, ())) else "checker"
    if is_users(code.co_filename):
        instruction = next((i for i in dis.get_instructions(code) if i.offset == tb.tb_lasti), None)
        if instruction is not None and instruction.opname in ("RAISE_VARARGS", "RERAISE"):
            return "raise"
    return "call"


@functools.lru_cache(maxsize=1)
def passed_on():
    """{file: its lines}, in this check's files, where a wrapper calls what it wraps (original(...),
    real(...)): an error raised there is the call's, passed on, not this check's."""
    found = {}
    for path in sorted(Path(OURS).rglob("*.py")):
        tree = ast.parse(path.read_text())
        found[str(path)] = [
            (node.lineno, node.end_lineno)
            for node in ast.walk(tree)
            if isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("original", "real")
        ]
    return found


def at_exit(w):
    with Quietly(w):
        write_exit(w)


def write_exit(w):
    import torch

    values = weights_summary(w.weights)
    observe_writes(w, every=True)
    graphs = None
    if "torch._dynamo" in sys.modules:
        graphs = sys.modules["torch._dynamo"].utils.counters["stats"]["unique_graphs"]
    w.rec.add(
        "exit",
        weights=values,
        inputs=[float(x) for x in torch.stack(w.inputs).tolist()] if w.inputs else [],
        graphs=graphs,
        steps=w.state["step"],
        evaluations=w.state["evaluations"],
        eval_inputs=[float(x) for x in torch.stack(w.eval_inputs).tolist()] if w.eval_inputs else [],
        empty=sorted({path for path, _, how in w.written if how != "os.mkdir" and is_empty(path)}),
        files=own_files(w),
        # the last sharded model's parameters as held (kept alive by w.weights, the model freed or not)
        wrote=dict(w.wrote),
        dcp={path: sharded_checkpoint_covered(path) for path in sorted(w.sharded_saves)},
        sharded=sum(float(local(p).double().sum()) for p in w.weights) if w.sharded else None,
    )


def own_files(w):
    """The script's own Python files that this process imported (the script's, and its modules beside
    it), as the records cite files: so that the judge can read the code the run did not reach."""
    found = set()
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if isinstance(path, str) and path.endswith(".py") and is_users(path) and os.path.isfile(path):
            real = os.path.realpath(path)
            if not real.startswith(w.folder):  # this check's own sitecustomize
                found.add(os.path.relpath(real))
    return sorted(found)


def sharded_checkpoint_covered(path):
    """[the tensors a sharded checkpoint's metadata lists, those whose chunks cover them whole], or None
    where it cannot be read: whole, a resume at any world size loads them (torch.distributed.checkpoint
    reshards on load)."""
    import math

    try:
        from torch.distributed.checkpoint import FileSystemReader

        metadata = FileSystemReader(path).read_metadata()
    except Exception:  # noqa: BLE001 (not a folder of a finished save: not known)
        return None
    tensors = [m for m in metadata.state_dict_metadata.values() if hasattr(m, "chunks")]
    whole = sum(sum(math.prod(c.sizes) for c in m.chunks) == math.prod(m.size) for m in tensors)
    return [len(tensors), whole]
