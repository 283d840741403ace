"""Record the jobs that tests/test_check_ddp.py judges again: each case of tests/check_ddp_cases/
checked live, as a user would, and what its job left (the records, the output, how it ended)
kept in tests/check_ddp_jobs/<case>/ with the report it gave.

    python tests/record_check_ddp_jobs.py                 # every case (about 7 minutes on 2 cores)
    python tests/record_check_ddp_jobs.py mnist_ok ...    # these cases
    python tests/record_check_ddp_jobs.py --readme        # the README's sample report, and its job

Record a case again when its script changes, or when the watcher records something new; a rule's
new wording only needs the reports again: python tests/record_check_ddp_jobs.py --reports.

--readme runs the README's sample check as the README gives it, writes the report it printed into
the README, times and all, and keeps its job in tests/readme_report_job/, from which
tests/test_figures.py judges the README's report again: record it with the figures, on a quiet
machine, and again whenever the cases are.
"""

import re
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parent.parent)]
from test_check_ddp import (  # noqa: E402
    CASES,
    JOBS,
    README_JOB,
    README_REPORT,
    ROOT,
    check,
    job_folder,
    normalised,
    readme_report,
)

from check_ddp.job import Job  # noqa: E402
from check_ddp.report import report  # noqa: E402
from check_ddp.verdict import judge  # noqa: E402

KEPT = ("job.json", "output.log", "rank*.jsonl")  # what the judge reads


def record(case):
    with tempfile.TemporaryDirectory() as work:
        shutil.copy(case, Path(work) / case.name)
        proc, said = check(case.name, cwd=work, expect=None)
    kept = keep(job_folder(said), JOBS / case.stem)
    job = Job.load(kept)
    (kept / "report.txt").write_text(normalised(report(job, judge(job))) + "\n")
    return f"{case.stem}: exit {proc.returncode}"


def keep(folder, kept):
    """What the judge reads of the job in folder, kept in kept (and the folder removed)."""
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True)
    run = Path()
    while (folder / run / "job.json").is_file():  # the job, and each run of it again (then/, then/then/)
        (kept / run).mkdir(parents=True, exist_ok=True)
        for pattern in KEPT:
            for path in (folder / run).glob(pattern):
                shutil.copy(path, kept / run / path.name)
        run = run / "then"
    shutil.rmtree(folder)
    return kept


def record_readme():
    """The README's sample report, printed by its command today, written into the README (its pitfall
    as seen from the project's folder, where the README runs it); its job kept."""
    with tempfile.TemporaryDirectory() as work:
        proc, _ = readme_report(Path(work))
    folder = re.search(r"The job's own output: (\S+)/output\.log$", proc.stdout.strip()).group(1)
    keep(Path(folder), README_JOB)
    report = re.sub(r"\S*(pitfalls/\w+\.py)", r"\1", proc.stdout)  # as from the project's folder
    report = re.sub(r"python \S*check_ddp\.py --explain", "python check_ddp.py --explain", report)
    readme = (ROOT / "README.md").read_text()
    shown = README_REPORT.search(readme)
    (ROOT / "README.md").write_text(readme[: shown.start(2)] + report + readme[shown.end(2) :])
    print(report, end="")


def rewrite_reports():
    """The reports of the jobs already recorded, made again by today's judge."""
    for folder in sorted(p for p in JOBS.iterdir() if p.is_dir()):
        job = Job.load(folder)
        (folder / "report.txt").write_text(normalised(report(job, judge(job))) + "\n")
        print(folder.name)


if __name__ == "__main__":
    if sys.argv[1:] == ["--reports"]:
        rewrite_reports()
        sys.exit()
    if sys.argv[1:] == ["--readme"]:
        record_readme()
        sys.exit()
    names = set(sys.argv[1:])
    chosen = [case for case in CASES if not names or case.stem in names]
    if names - {case.stem for case in chosen}:
        sys.exit(f"no such case: {', '.join(sorted(names - {case.stem for case in chosen}))}")
    with ThreadPoolExecutor(max_workers=3) as pool:
        for line in pool.map(record, chosen):
            print(line, flush=True)
