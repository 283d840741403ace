"""A rank's records, written as they happen (Recorder); what the watcher knows of the script's objects,
kept beside them (Beside); and Quietly, around the watcher's own bookkeeping, so that an error of
the check's is recorded and never reaches the script."""

import contextlib
import functools
import json
import os
import threading
import time
import weakref

from ..records import check_record
from .evidence import ends
from .frames import main_thread_position


class Beside:
    """What the watcher knows of one of the script's objects (a DataLoader, its iterator, a model, a
    tensor), kept beside it, by its identity, for as long as it lives: never on it, where it would
    travel into the script's own copies, pickles and checkpoints."""

    def __init__(self):
        self.table = {}

    def get(self, thing, default=None):
        entry = self.table.get(id(thing))
        return entry[1] if entry is not None and entry[0]() is thing else default

    def set(self, thing, value):
        key = id(thing)
        forget = functools.partial(self.table.pop, key, None)
        self.table[key] = (weakref.ref(thing, lambda _: forget()), value)
        return value


class Quietly:
    """`with Quietly(w):` around the watcher's own bookkeeping. Whatever goes wrong in it is this file's
    error, not the script's: recorded as a fault (once a place), and never passed on to the script,
    which goes on as if it were not watched."""

    __slots__ = ("w",)

    def __init__(self, w):
        self.w = w

    def __enter__(self):
        return self

    def __exit__(self, kind, error, tb):
        if kind is None or not issubclass(kind, Exception):
            return False
        with contextlib.suppress(Exception):
            while tb.tb_next is not None:
                tb = tb.tb_next
            at = f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
            if at not in self.w.faults:
                self.w.faults.add(at)
                self.w.rec.add("fault", type=kind.__name__, message=ends(str(error)), at=at)
        return True


class Recorder:
    """A rank's records, each appended to rank<R>.jsonl as it happens (a line written is the
    system's, even if the process then aborts), and a background thread that notes twice a second
    where the main thread is: so that even a rank stuck in a collective, or killed, leaves what it
    did and where it waits."""

    def __init__(self, path):
        # reentrant: a record can be added while another is written (a finalizer run by the garbage
        # collector, in the middle of one)
        self.file, self.lock = open(path, "a", buffering=1), threading.RLock()
        self.enabled = True
        self.strict = bool(os.environ.get("CHECK_DDP_STRICT"))
        self.position = None
        self.main = threading.main_thread().ident
        threading.Thread(target=self.note_position, daemon=True, name="check_ddp").start()

    def add(self, kind, **fields):
        if self.enabled:
            event = {"e": kind, **fields}
            if self.strict:
                check_record(event)
            line = json.dumps(event, default=str, separators=(",", ":")) + "\n"
            with self.lock:
                self.file.write(line)

    def note_position(self):
        while True:
            time.sleep(0.5)
            position = main_thread_position(self.main)
            if position != self.position or position[3]:  # compiling: busy, however long one step takes
                self.position = position
                self.add("now", call=position[0], stack=position[1], inner=position[2])
