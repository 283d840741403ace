"""DDP step 6: checkpoints saved and loaded (each read back as torch.load would read it), state dicts
loaded into models, and every file the script writes (Python's audit hook)."""

import importlib.util
import os
import re

from .evidence import describe_checkpoint, path_of, refused_on_load, shared_folder, weights_summary
from .frames import LIBRARY_DIRS, called_by_user, is_users, outside_stdlib, users_stack, where
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
                event["stack"] = users_stack()
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
                # after training, into the replica trained: what it held as training ended, to compare
                # the ranks' replicas by (a rank's own use of other weights, after, is its own)
                ours = {id(p) for p in w.weights}
                trained = w.state["step"] and any(id(p) in ours for p in self.parameters())
                w.rec.add(
                    "load_state",
                    into=type(self).__name__,
                    ddp=isinstance(self, DistributedDataParallel),
                    prefixed=bool(keys) and all(str(k).startswith("module.") for k in keys),
                    at=where(),
                    trained=weights_summary(w.weights) if trained else None,
                )
        return original(self, state_dict, *args, **kwargs)

    return load_state_dict


def audit(w, event, args):
    """Python's audit hook: every file the script opens to write, or renames into place; an MPI
    library imported, which other launchers (mpirun) tell who each process is. (An error in an audit
    hook stops what it audits: none of this file's may reach the script's open().)"""
    if event in ("open", "os.rename", "os.replace", "os.mkdir", "import"):
        with Quietly(w):
            observe_writes(w)
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
        w.rec.add(
            "write", path=target, at=at, how=event, source=source, mode=how_written, stack=users_stack()
        )
    if how_written == "overwrite" and event == "open":
        w.unseen.add(target)
        w.wrote.setdefault(target, 0)


# What a rank wrote into a file it opened to write over: several ranks that open one file with "w" write
# it over each other only if more than one of them writes something into it (every rank clearing a log
# that rank 0 alone then fills is no race). The watcher sees opens, not writes: it looks at each handle's
# position (the bytes written through it, the system's own count) at the rank's next call that another
# rank could be waiting on (a collective, the group's making, a forward through DDP, an optimizer step,
# the next file opened) and at the end; a handle closed before the look leaves the file's size: empty,
# nothing was written; else not known, counted as written.


def observe_writes(w, every=False):
    """Look at what this rank has written, through the handles it holds, into the files it opened to
    write over since the last look (every: and through every handle it still holds, at the end).
    Linux's /proc tells which files a process holds; elsewhere nothing is known, and every such file
    counts as written."""
    if not w.unseen and not (every and w.wrote):
        return
    held = open_descriptors()
    for path in set(w.wrote) if every else set(w.unseen):
        positions = [position(fd) for fd in (held or {}).get(path, [])]
        if held is None or None in positions:
            w.wrote[path] = None
        elif positions:  # still held: looked at again at the next call
            if w.wrote[path] is not None:
                w.wrote[path] = max(w.wrote[path], *positions)
            continue
        elif (
            path in w.unseen
            and w.wrote[path] == 0
            and not (os.path.isfile(path) and not os.path.getsize(path))
        ):
            w.wrote[path] = (
                None  # closed before a look, and the file holds something: who wrote it is not known
            )
        w.unseen.discard(path)


def open_descriptors():
    """{the real path of each file this process holds open: its descriptors}, or None where the system
    does not say (no /proc/self/fd)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    held = {}
    for name in names:
        try:
            held.setdefault(os.readlink(f"/proc/self/fd/{name}"), []).append(int(name))
        except (OSError, ValueError):
            continue
    return held


def position(fd):
    """Where a descriptor is in its file: the bytes written through it, for a file opened to write over."""
    try:
        return os.lseek(fd, 0, os.SEEK_CUR)
    except OSError:
        return None
