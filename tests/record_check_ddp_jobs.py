"""Record the jobs that tests/test_check_ddp.py judges again: each case of tests/check_ddp_cases/
checked live, as a user would, and what its job left (the records, the output, how it ended)
kept in tests/check_ddp_jobs/<case>/ with the report it gave.

    python tests/record_check_ddp_jobs.py                 # every case (about 7 minutes on 2 cores)
    python tests/record_check_ddp_jobs.py mnist_ok ...    # these cases

Record a case again when its script changes, or when the watcher records something new; a rule's
new wording only needs the reports again: python tests/record_check_ddp_jobs.py --reports.
"""

import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from test_check_ddp import CASES, JOBS, check, job_folder, load_tool, normalised  # noqa: E402

KEPT = ("job.json", "output.log", "rank*.jsonl")  # what the judge reads


def record(case):
    with tempfile.TemporaryDirectory() as work:
        shutil.copy(case, Path(work) / case.name)
        proc, report = check(case.name, cwd=work, expect=None)
    folder, kept = job_folder(report), JOBS / case.stem
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
    tool = load_tool()
    job = tool.Job.load(kept)
    (kept / "report.txt").write_text(normalised(tool.report(job, tool.judge(job))) + "\n")
    return f"{case.stem}: exit {proc.returncode}"


def rewrite_reports():
    """The reports of the jobs already recorded, made again by today's judge."""
    tool = load_tool()
    for folder in sorted(p for p in JOBS.iterdir() if p.is_dir()):
        job = tool.Job.load(folder)
        (folder / "report.txt").write_text(normalised(tool.report(job, tool.judge(job))) + "\n")
        print(folder.name)


if __name__ == "__main__":
    if sys.argv[1:] == ["--reports"]:
        rewrite_reports()
        sys.exit()
    names = set(sys.argv[1:])
    chosen = [case for case in CASES if not names or case.stem in names]
    if names - {case.stem for case in chosen}:
        sys.exit(f"no such case: {', '.join(sorted(names - {case.stem for case in chosen}))}")
    with ThreadPoolExecutor(max_workers=3) as pool:
        for line in pool.map(record, chosen):
            print(line, flush=True)
