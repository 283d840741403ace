"""DDP step 6: checkpoints saved and loaded (each read back as torch.load would read it), state dicts
loaded into models, and every file the script writes (Python's audit hook)."""

import importlib.util
import os
import re

from .evidence import describe_checkpoint, path_of, refused_on_load, shared_folder
from .frames import LIBRARY_DIRS, called_by_user, is_users, outside_stdlib, where
from .recorder import Quietly
from .registry import watches


@watches("torch", "save", step=6, label="torch.save()")
def torch_save(original, w, _):
    def torch_save(obj, f, *args, **kwargs):
        event = None
        with Quietly(w):
            if called_by_user():
                path = path_of(f)
                event = dict(path=path and os.path.abspath(path), at=where(), what=describe_checkpoint(obj))
        result = original(obj, f, *args, **kwargs)
        if event is not None:
            with Quietly(w):
                # what a resume would meet, exercised here, where it is cheap: the file read back as
                # torch.load(weights_only=True) reads it (its pickle alone, not its tensors)
                event["unsafe"], event["unsafe_at"] = refused_on_load(event["path"], obj)
                w.rec.add("save", **event)
        return result

    return torch_save


@watches("torch", "load", step=6, label="torch.load()")
def torch_load(original, w, _):
    def torch_load(f, *args, **kwargs):
        with Quietly(w):
            if called_by_user():
                path = path_of(f)
                w.rec.add(
                    "load",
                    path=path and os.path.abspath(path),
                    at=where(),
                    weights_only=kwargs.get("weights_only"),
                    map_location="map_location" in kwargs or len(args) > 0,
                    shared=path is not None and shared_folder(path),
                )
        return original(f, *args, **kwargs)

    return torch_load


@watches("torch.nn.Module", "load_state_dict", step=6, label="model.load_state_dict()")
def load_state_dict(original, w, _):
    from torch.nn.parallel import DistributedDataParallel

    def load_state_dict(self, state_dict, *args, **kwargs):
        with Quietly(w):
            if called_by_user():
                keys = list(state_dict) if isinstance(state_dict, dict) else []
                w.rec.add(
                    "load_state",
                    into=type(self).__name__,
                    ddp=isinstance(self, DistributedDataParallel),
                    prefixed=bool(keys) and all(str(k).startswith("module.") for k in keys),
                    at=where(),
                )
        return original(self, state_dict, *args, **kwargs)

    return load_state_dict


def audit(w, event, args):
    """Python's audit hook: every file the script opens to write, or renames into place; an MPI
    library imported, which other launchers (mpirun) tell who each process is. (An error in an audit
    hook stops what it audits: none of this file's may reach the script's open().)"""
    if event in ("open", "os.rename", "os.replace", "os.mkdir", "import"):
        with Quietly(w):
            audited(w, event, args)


def audited(w, event, args):
    if event == "import" and args[0] == "mpi4py" and w.rec.enabled and "import mpi4py" not in w.read:
        w.read.add("import mpi4py")
        frame = outside_stdlib()
        by = "script" if frame is not None and is_users(frame.f_code.co_filename) else "library"
        found = importlib.util.find_spec("mpi4py") is not None
        w.rec.add("read", key="import mpi4py", by=by, at=where(), found=found)
    if not w.rec.enabled or event not in ("open", "os.rename", "os.replace", "os.mkdir"):
        return
    if event == "os.mkdir":  # a folder made: a name that a second maker finds taken
        if not isinstance(args[0], (str, bytes)):
            return
        target, how_written = os.path.realpath(os.fsdecode(args[0])), "create"
    elif event == "open":
        path, mode, flags = args
        if not isinstance(path, (str, bytes)) or not (
            (isinstance(mode, str) and set(mode) & set("wax+")) or (mode is None and flags & 0o3)
        ):
            return
        target = os.path.realpath(os.fsdecode(path))
        appends = "a" in mode if isinstance(mode, str) else bool(flags & os.O_APPEND)
        kept = "+" in mode and "w" not in mode if isinstance(mode, str) else not flags & os.O_TRUNC
        how_written = "append" if appends else None if kept else "overwrite"
    else:
        target = os.path.realpath(os.fsdecode(args[1]))
        how_written = "overwrite"
    if target.startswith((w.folder, "/dev/", "/proc/", "/sys/", w.caches, *LIBRARY_DIRS)) or re.search(
        r"torchinductor|triton|__pycache__", target
    ):
        return  # not the script's files: this tool's, the system's, torch's caches
    at = where()
    if (target, at, event) not in w.written:
        w.written.add((target, at, event))
        source = os.path.realpath(os.fsdecode(args[0])) if event in ("os.rename", "os.replace") else None
        w.rec.add("write", path=target, at=at, how=event, source=source, mode=how_written)
