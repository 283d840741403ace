"""Whose code a frame is: the script's own, or torch's, the standard library's, or this check's; and
where the script's code made the call a wrapper is in (file:line), which every record cites."""

import functools
import os
import re
import sys
import sysconfig

from .registry import CALL_OF_CODE

# this check's own code: every file of its package (a frame of one is never the script's)
OURS = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep
# the job's folder, where the check's sitecustomize.py runs the watcher: its frames are the check's too
JOB_FOLDER = (
    os.path.realpath(os.environ["CHECK_DDP_FOLDER"]) + os.sep if "CHECK_DDP_FOLDER" in os.environ else None
)
TORCH_DIR = ""  # torch's own folder: set once torch is imported, in watch()
LIBRARY_DIRS = tuple(
    os.path.realpath(p) for p in {sysconfig.get_paths()[k] for k in ("stdlib", "purelib", "platlib")}
)

STDLIB = os.path.realpath(sysconfig.get_paths()["stdlib"])


def is_ours(filename):
    """A file of this check's own: of its package, or the sitecustomize.py it runs the watcher from."""
    path = os.path.realpath(filename)
    return path.startswith(OURS) or bool(JOB_FOLDER and path.startswith(JOB_FOLDER))


def is_users(filename):
    """A frame of the script's own code, not torch's, the standard library's, or this check's."""
    path = os.path.realpath(filename)
    return not (
        filename.startswith("<")
        or is_ours(path)
        or (TORCH_DIR and path.startswith(TORCH_DIR))
        or path.startswith(LIBRARY_DIRS)
    )


def place(frame):
    return f"{os.path.relpath(frame.f_code.co_filename)}:{frame.f_lineno}"


def callers_frame():
    """The frame that called into this check: the first one, going out, that is not this check's.
    However deep a wrapper calls this, the answer is the same."""
    frame = sys._getframe(1)
    while frame is not None and is_ours(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def outside_stdlib():
    """The frame that called into this check, past the standard library's own frames (os.getenv,
    argparse's parse_args): whose code asked, the script's or a library's."""
    frame = callers_frame()
    while frame is not None and stdlib(frame.f_code.co_filename):
        frame = frame.f_back
    return frame


def stdlib(filename):
    """A file of Python's standard library: under its folder, or frozen into the interpreter (os and
    _collections_abc are, from Python 3.11: os.environ.get's frames are "<frozen _collections_abc>")."""
    return filename.startswith("<frozen ") or os.path.realpath(filename).startswith(STDLIB)


def where():
    """file:line of the script's code that made the current call (going out past torch's frames)."""
    frame = callers_frame()
    while frame is not None and not is_users(frame.f_code.co_filename):
        frame = frame.f_back
    return place(frame) if frame is not None else None


def users_stack(limit=8):
    """The script's own lines that led to the current call, innermost first: where it was called from
    (a write inside a function called under `if local_rank == 0:` is guarded there)."""
    frame, stack = callers_frame(), []
    while frame is not None and len(stack) < limit:
        if is_users(frame.f_code.co_filename):
            stack.append(place(frame))
        frame = frame.f_back
    return stack


def called_by_user():
    """Whether the current call comes straight from the script's code (not from torch's own)."""
    frame = callers_frame()
    return frame is not None and is_users(frame.f_code.co_filename)


def within(folder):
    """Whether a frame of torch's folder (as "distributed/checkpoint") is on the current stack."""
    mark = os.sep + "torch" + os.sep + folder.replace("/", os.sep) + os.sep
    frame = sys._getframe(1)
    while frame is not None:
        if mark in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


# the files torch runs while it compiles, and only then: dynamo's frame conversion, inductor's compilation,
# AOT autograd's (the backward's graph, compiled at the first backward)
COMPILING = re.compile(
    r"torch[/\\](_dynamo[/\\]convert_frame|_inductor[/\\](compile_fx|codecache|graph)|_functorch[/\\]_aot_autograd)"
)


def main_thread_position(main):
    """(the watched call the main thread is in, or None; the script's lines it came from, innermost
    first; the innermost frame, which moves while it computes; whether torch is compiling)."""
    frame = sys._current_frames().get(main)
    call, stack, inner, compiling = None, [], place(frame) if frame else None, False
    while frame is not None:
        if call is None and not stack and frame.f_code in CALL_OF_CODE:
            call = CALL_OF_CODE[frame.f_code]
        if is_users(frame.f_code.co_filename):
            stack.append(place(frame))
        # compiling: torch's compiler at work, its compile paths on the stack (not a wrapper of its on the
        # way, as torch.compiler.disable's around DDP's forward and FSDP's hooks, over a collective that
        # waits: a hang that looked busy for ever)
        compiling = compiling or COMPILING.search(frame.f_code.co_filename)
        frame = frame.f_back
    del frame
    return call, stack[:8], inner, bool(compiling)


@functools.lru_cache(maxsize=4096)
def in_torch(code):
    return bool(TORCH_DIR) and os.path.realpath(code.co_filename).startswith(TORCH_DIR)
