"""Check a DDP training script by running it: one line per DDP step, ok, warn or FAIL, with evidence.

The command line (python check_ddp.py, check-ddp, python -m check_ddp): what it is asked, the job it
runs (check_ddp.run), the verdict (check_ddp.judge) and the report (check_ddp.report)."""

import argparse
import json
import shutil
import signal
import sys
from pathlib import Path

from .explain import explain
from .job import Job
from .judge.registry import RULES
from .judge.source import unknown_ignores
from .records import FORMAT
from .report import as_json, explain_command, report
from .run import run_job
from .verdict import judge, judge_run
from .worker import recorder


def main(argv=None):
    """python check_ddp.py ...: explain a code, judge a job's folder again, or check a script."""
    if hasattr(signal, "SIGPIPE"):  # a report piped into head ends quietly, as other tools' do
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    parser = arguments()
    options = parser.parse_args(argv)
    if options.explain is not None:
        text = explain(options.explain)
        if text is None:
            parser.error(f"{options.explain}: no such code ({explain_command()} lists them)")
        print(text)
        return 0
    if options.judge:
        job, judged = judged_folder(parser, options), {}
    else:
        job, judged = checked_script(parser, options)
    verdict = judge(job, judged)
    print(json.dumps(as_json(job, verdict), indent=1) if options.format == "json" else report(job, verdict))
    return verdict.status


def arguments():
    parser = argparse.ArgumentParser(
        prog="check_ddp.py",
        description=__doc__.splitlines()[0],
        epilog="Options go before the script; what follows the script is passed to it. The report has a "
        "line per DDP step: ok, warn, FAIL, or -- (not checked: the job did not show it, or it follows from "
        "another step's FAIL). Exit status: 0 no step failed, 1 a step failed or the script stopped with "
        "its own error, 2 a usage error, 3 "
        "check_ddp's own error (not your script's). The job runs in this folder, and leaves there what your "
        "script writes.",
    )
    parser.add_argument("--nproc", type=int, default=2, help="processes to start (default: 2)")
    parser.add_argument(
        "--silence",
        type=float,
        default=20,
        help="seconds without progress after which the job is stopped as hung (default: 20)",
    )
    parser.add_argument(
        "--cpu",
        action="store_true",
        help="run on the CPU even where there are GPUs: CUDA and NCCL stood in, as where there are too few",
    )
    parser.add_argument(
        "--nnodes",
        type=int,
        help="nodes to show the processes as, as many processes on each (default: 2 on the CPU, or one a "
        "process for an odd number; 1 on GPUs)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="show the job's own output as it runs")
    parser.add_argument(
        "--explain",
        nargs="?",
        const="",
        metavar="CODE",
        help="explain what a finding's code means (alone: list every code); runs nothing",
    )
    parser.add_argument(
        "--judge",
        metavar="FOLDER",
        help="judge again the job a check left in FOLDER (or its output.log, as the report's last line names "
        "it); runs nothing",
    )
    parser.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="the report as text (default), or as JSON: each DDP step's finding with its verdict, code, "
        "message, file:line, help and see, for editors and CI",
    )
    parser.add_argument("script", nargs="?", help="your training script")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="its own arguments")
    return parser


def judged_folder(parser, options):
    """--judge FOLDER: the job a check left there, as it was recorded."""
    folder = Path(options.judge)
    folder = folder.parent if folder.is_file() else folder  # .../output.log, as the report names it
    if not (folder / "job.json").is_file():
        parser.error(f"{options.judge}: not the folder of a job (it has no job.json)")
    made, ours = Job.made_by(folder), (FORMAT, recorder())
    if made != ours:  # not a mistake in the command: one line, no usage
        print(
            f"check_ddp.py: {options.judge}: recorded by another version of check_ddp.py (format "
            f"{made[0]}, recorder {made[1]}; this one's: {ours[0]}, {ours[1]}): check the script again "
            "with this one",
            file=sys.stderr,
        )
        sys.exit(2)
    return Job.load(folder)


def checked_script(parser, options):
    """The script, run as a job under the watcher, once its options are known to be sound."""
    if options.script is None:
        parser.error("name your training script: python check_ddp.py my_train.py [its args]")
    if not Path(options.script).is_file():
        parser.error(f"{options.script}: no such file")
    unknown = unknown_ignores(Path(options.script).read_text(errors="replace"))
    if unknown:  # before the job runs: a silencing comment must name a code
        line, code = unknown[0]
        parser.error(
            f"{options.script}:{line}: # check_ddp: ignore[{code}] names no code of check_ddp's "
            f"({explain_command()} lists them)"
        )
    if options.nproc < 2:
        parser.error("--nproc must be at least 2: one process cannot share anything")
    if options.silence <= 0:
        parser.error("--silence must be more than 0 seconds")
    if options.nnodes is not None and (options.nnodes < 1 or options.nproc % options.nnodes):
        parser.error(f"--nnodes must divide --nproc ({options.nproc}): as many processes on each node")
    job = run_job(options)
    last, aside, judged = job, set(), {}
    # a job stopped by a mistake the check can set aside (its own launch variables over torchrun's,
    # a GPU index that only the rehearsed layout lacks): checked again without it, so that what the
    # mistake hid is checked too; the report gives both. Each run is judged once.
    while True:
        judged[last.folder] = judge_run(last)
        more = set_aside(options, last, judged[last.folder]) - aside
        if not more or len(aside) >= 2:
            break
        aside |= more
        then = run_job(options, aside=aside)
        shutil.move(str(then.folder), last.folder / "then")
        last.then = "then"
        last.save()
        last = Job.load(last.folder / "then")
    return Job.load(job.folder), judged


def set_aside(options, job, judged):
    """What a run again sets aside, to check the rest: "launch", the script's own launch variables and
    init_process_group() arguments over torchrun's (torchrun's are kept); "layout", the rehearsed nodes
    (one node of all the processes); "launcher", torchrun's launch, the job made as the launcher the
    script was written for would make it. A launch of the script's own (and a rule's sets_aside marked
    "always") is set aside whether or not the job stopped; anything else only where it stopped the job."""
    stopped = job.hung or job.returncode
    found = {
        kind
        for x in judged.stoppers
        if stopped or RULES[x.code].launch == "root" or "always" in RULES[x.code].sets_aside
        for kind in RULES[x.code].sets_aside
        if kind != "always"
    }
    if options.nnodes is not None or job.nnodes == 1:
        found.discard("layout")
    if missing_imports(job):  # as its launcher starts it, the script needs what this machine lacks
        found.discard("launcher")
    return found


def missing_imports(job):
    """The modules the script imports for another launcher (mpi4py) that are not installed here."""
    return [
        e["key"][len("import ") :]
        for _, e in job.records("read")
        if e["key"].startswith("import ") and not e["found"]
    ]
