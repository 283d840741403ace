"""What a run of the script left in its folder, all the judge reads: each rank's records, the job's
output, and how it ended. A folder is enough to judge a job again (check_ddp.py --judge FOLDER)."""

import json
import os
import re
from pathlib import Path

from .records import FORMAT, check_record, with_defaults
from .worker import recorder


class Job:
    """What a run of the script left in its folder, all the judge reads: each rank's records
    (rank<R>.jsonl), the job's output (output.log), and how it ended (job.json: the command,
    the device, exit status, seconds, whether it hung or stuck at exit, the folder it ran in,
    and the text of the script's files that the records cite)."""

    ENDING = (
        "command", "nproc", "nnodes", "silence", "device", "cwd", "returncode", "seconds", "hung",
        "stuck_at_exit", "then", "aside",
    )  # fmt: skip

    def __init__(self, folder, command, nproc, nnodes, silence, device, cwd):
        self.folder, self.command, self.nproc, self.nnodes = Path(folder), command, nproc, nnodes
        self.silence, self.device, self.cwd = silence, device, cwd  # device: cuda, or cpu (stood in)
        self.ranks = {}  # rank: its records, in order
        self.output = ""
        self.returncode = None
        self.seconds = 0.0
        self.hung = False  # stopped after --silence seconds without progress
        self.stuck_at_exit = False  # every rank finished its script, but a process did not end
        self.sources = {}  # a file the records cite (as they cite it): its text
        self.then = None  # the subfolder of the same job run again with what stopped it set aside
        self.aside = []  # what this run set aside ("launch", "layout"): see set_aside()

    def records(self, kind, rank=None):
        ranks = self.ranks.items() if rank is None else [(rank, self.ranks.get(rank, []))]
        return [(r, e) for r, events in ranks for e in events if e["e"] == kind]

    def read_records(self):
        """Each rank's records as its watcher wrote them (a line cut off by a kill is left out)."""
        self.ranks = {}
        for path in sorted(self.folder.glob("rank*.jsonl")):
            lines = path.read_text().splitlines()
            self.ranks[int(path.stem[4:])] = [json.loads(line) for line in lines if line.endswith("}")]
        if os.environ.get("CHECK_DDP_STRICT"):
            for events in self.ranks.values():
                for event in events:
                    check_record(event)
        self.ranks = {r: [with_defaults(e) for e in events] for r, events in self.ranks.items()}

    def source(self, path):
        """The text of one of the script's files, as the job saw it; None if unknown."""
        if path in self.sources:
            return self.sources[path]
        try:
            return Path(self.cwd, path).read_text()
        except (OSError, UnicodeDecodeError):
            return None

    def relpath(self, path):
        """A path the job wrote, as seen from the folder the job ran in."""
        return os.path.relpath(path, self.cwd)

    def save(self):
        """job.json: how the job ended, and the script's files that the records cite, so that the
        folder alone can be judged again (python check_ddp.py --judge FOLDER)."""
        cited = set()
        for events in self.ranks.values():
            for e in events:
                for at in [e.get("at"), *(e.get("stack") or [])]:
                    if isinstance(at, str) and ":" in at:
                        cited.add(at.rpartition(":")[0])
                for path in re.findall(r'File "([^"]+)", line', e.get("message") or ""):  # a child's
                    cited.add(os.path.relpath(path, self.cwd))
                cited.update(e.get("files") or ())  # every file of the script's it imported
        script = next((a for a in self.command[1:] if a.endswith(".py")), None)
        if script:
            cited.add(
                os.path.relpath(os.path.join(self.cwd, script), self.cwd)
            )  # its code that never ran too
        self.sources = {path: text for path in sorted(cited) if (text := self.source(path)) is not None}
        ending = {name: getattr(self, name) for name in self.ENDING}
        made = {"format": FORMAT, "recorder": recorder()}
        (self.folder / "job.json").write_text(
            json.dumps({**made, **ending, "sources": self.sources}, indent=1)
        )

    @staticmethod
    def made_by(folder):
        """(format, recorder) of the check_ddp.py that recorded the job in folder."""
        saved = json.loads((Path(folder) / "job.json").read_text())
        return saved.get("format", 1), saved.get("recorder")

    @classmethod
    def load(cls, folder):
        saved = json.loads((Path(folder) / "job.json").read_text())
        job = cls(
            folder, *(saved[name] for name in ("command", "nproc", "nnodes", "silence", "device", "cwd"))
        )
        for name in cls.ENDING:
            setattr(job, name, saved.get(name, getattr(job, name)))
        job.sources = saved["sources"]
        log = Path(folder) / "output.log"
        job.output = log.read_text(errors="replace") if log.is_file() else ""
        job.read_records()
        return job


def runs(job):
    """The job, and each run of it again with what stopped it set aside, in order."""
    found = [job]
    while found[-1].then:
        found.append(Job.load(found[-1].folder / found[-1].then))
    return found
