"""check_ddp: check a DDP training script by running it, one line per DDP step, ok, warn or FAIL.

    python check_ddp.py my_train.py [its args]     # from this project (or: python -m check_ddp ...)
    check-ddp my_train.py [its args]               # once the project is installed: pip install .

It starts the script as a small job, `torchrun --standalone --nproc_per_node=2 my_train.py ...`,
watches every process from the inside without changing the script, and reports on the steps of
README.md. How it works, in the order the data flows (the package's parts, in this order):

1. run (run.py, job.py): run_job() starts torchrun with the watcher loaded in each of its workers,
   and stops a job that makes no progress. All that the job leaves is in its folder: each rank's
   records (rank<R>.jsonl), the job's output (output.log) and how it ended (job.json). That folder
   is enough to judge the job again (--judge), without running anything.
2. record (watch/, records.py): in each worker, watch() puts wrappers around what a DDP script
   calls, one small function per call, each declaring its step and the label a report prints
   (watch/registry.py). Each writes records of the kinds records.SCHEMA declares, the contract
   between watcher and judge. The stand-in (standin/), where there are no GPUs, puts CPU versions
   of CUDA and NCCL in torch's place, declared as the watcher's wrappers are and applied first.
   Nothing on this side imports the judge: it runs inside the learner's processes.
3. judge (judge/, rules/, verdict.py): Facts reads a job's records and derives, once, what several
   rules need; Source reads the script's code as the job saw it, for what the run did not show. Each
   rule is one finding, in the module of its DDP step (rules/step3_shard.py holds DDP3xx): a code, its
   verdict, its help, and its docstring, the explanation --explain prints (explain.py). verdict.py
   runs them: judge(job) returns the job's Verdict, and writes on nothing it is given.
4. report (report.py): a line per step, the script's own error after them, the verdict last.

How to add a check:
1. If the records do not show it yet, record it in a wrapper (@watches in watch/, or the
   stand-in's @stands_in): a new kind of record goes into records.SCHEMA, a new field of a kind
   into records.OPTIONAL with the value an older record means (a new kind changes recorder(), the
   digest --judge compares, and every recorded job must be recorded again). A private name of
   torch's the wrapper reads goes into watch/registry.py's PRIVATE.
2. Write the rule (@rule) in its step's module, at its place in judge/registry.py's ORDER (a cause
   before its symptoms, a FAIL before a warn of the same evidence), its docstring saying what
   happens, why, and what to do. A finding is filed by the call that caused it and the data it
   touched, never by the phase the job was in. One cause, one FAIL: what follows from it says so.
3. Add a case to tests/check_ddp_cases/ whose first line names the code, and record its job:
   python tests/record_check_ddp_jobs.py CASE.
"""
