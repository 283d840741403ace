"""check_ddp.py, tried on other people's code: scripts in tests/check_ddp_cases/ written in styles
not ours, the correct ones passing and each with one classic mistake failing at its step; and on
our own train_ddp.py, a hang, a crash, a missing file.

Each case states what the checker must say, on a line near its top:

    # check_ddp: exit 1, FAIL step 3 DDP305, see step3_missing_set_epoch
    # check_ddp: exit 0, warn step 7 DDP702

(tests/check_ddp_cases/README.md: the grammar), and the line the report must name, if any, ends with
`# check_ddp: here`.

Two ways of checking a case. Live (slow): check_ddp.py runs the case under torchrun, as a user
would, and the report must say what the case states; its job's folder, judged again, must give the
same report. Replayed (quick): each case's job, recorded once in tests/check_ddp_jobs/ (python
tests/record_check_ddp_jobs.py), is judged again, in milliseconds, so that every rule is checked on
every change; the report must be the one recorded, and say what the case states.
"""

import json
import os
import re
import shutil
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from helpers import ROOT, copy_scripts, cpu_env, notebook_exercise, readme_conversion, run, selected

from check_ddp.job import Job
from check_ddp.judge.registry import AT_THE_END, ORDER, RETIRED, RULES, SUMMARIES
from check_ddp.records import FORMAT
from check_ddp.report import as_json, report, see
from check_ddp.steps import PITFALLS, STEPS
from check_ddp.verdict import judge
from check_ddp.worker import recorder

CHECK = ROOT / "check_ddp.py"
PACKAGE = ROOT / "check_ddp"
CASES_DIR = ROOT / "tests" / "check_ddp_cases"
CASES = sorted(CASES_DIR.glob("*.py"))
JOBS = ROOT / "tests" / "check_ddp_jobs"

# The codes no case reaches yet, on a machine without GPUs: this list only shrinks (a case for
# each, and its code leaves the list; a new rule comes with its case).
UNREACHED = {
    "DDP102": "RANK, LOCAL_RANK or WORLD_SIZE written by the script",
    "DDP107": "ranks that never meet, with no MASTER_PORT of the script's",
    "DDP202": "a model on a GPU of its node other than its LOCAL_RANK's (seen with --nnodes 1)",
    "DDP301": "the same batches on every rank, without a DataLoader",
    "DDP306": "different datasets without a DistributedSampler",
    "DDP405": "replicas that differ at the end, though wrapped",
    "DDP504": "a hang whose cause the records do not show (each known cause has its case)",
    "DDP604": "the DDP wrapper pickled",
    "DDP605": "a file other than a checkpoint written by every rank",
    "DDP606": "a compiled model's _orig_mod. keys",
    "DDP701": "a process that does not end",
    "DDP804": "a script that stops before training, with no error of its own",
}


def steps_of(findings, see=None):
    """{step: (verdict, its words: message, help and see, code)}, from a report's findings: the JSON
    of `check_ddp.py --format json` (dicts), or the lines of judge()'s verdict (objects, with the
    report's see() to say where to read more)."""
    steps = {}
    for f in findings:
        if not isinstance(f, dict):
            f = {**vars(f), "see": see(f) if f.verdict in ("FAIL", "warn") else None}
        words = "\n".join(w for w in (f["message"], f["help"], f["see"]) if w)
        steps[f["step"] or 0] = (f["verdict"], words, f["code"])  # 0: the script's own error, no step's
    return steps


def normalised(report):
    """A report as it reads anywhere: the pitfalls beside check_ddp.py as the project names them,
    and no folder of the job (the rest is the job's, from its folder)."""
    report = re.sub(r"\S*(pitfalls/\w+\.py)", r"\1", report)
    report = re.sub(r"python \S*check_ddp\.py --explain", "python check_ddp.py --explain", report)
    return re.sub(r"The job's own output: .*$", "The job's own output: FOLDER/output.log", report.strip())


def check(script, *args, cwd, expect, silence=8, env=None):
    """python check_ddp.py --format json ... as a user (or an editor) would run it, every record held
    to the schema: the process, and its report as data."""
    command = [sys.executable, str(CHECK), "--silence", str(silence), "--format", "json", script, *args]
    env = {**(env or cpu_env()), "CHECK_DDP_STRICT": "1"}
    proc = run(command, cwd=cwd, env=env, expect=expect, timeout=150)
    return proc, json.loads(proc.stdout)


def job_folder(report):
    return Path(report["output"]).parent


def expectation(path, device="cpu"):
    """(exit status, {step: (verdict, code or None)}, the pitfall numbers named, the lines marked
    `here`), for a job that ran where device says: "cuda" (on real GPUs, one a process: the case's
    `gpu:` part, where it has one), or "cpu" (CUDA stood in, or none)."""
    text = path.read_text()
    line = re.search(r"^# check_ddp: (.*)$", text, re.M)
    assert line, f"{path.name} states no expectation"
    cpu, _, gpu = line.group(1).partition(", gpu:")
    on_gpus = device == "cuda" and bool(gpu)
    spec = gpu if on_gpus else cpu
    status = int(re.search(r"exit (\d)", cpu).group(1))
    if on_gpus:
        status = 1 if "FAIL" in gpu else 0
    verdicts = {  # "FAIL script DDP000": the script's own error, on a line of its own (step 0)
        int(step or 0): (verdict, code or None)
        for verdict, step, code in re.findall(r"(FAIL|warn|ok) (?:step (\d+)|script)(?: (DDP\d+))?", spec)
    }
    see = re.findall(r"see (step\d+_\w+)", spec)
    marked = [
        n for n, source in enumerate(text.splitlines(), 1) if source.rstrip().endswith("# check_ddp: here")
    ]
    return status, verdicts, see, marked


def assert_says_what_the_case_states(case, status, steps, stdout, device="cpu"):
    expected, verdicts, see, marked = expectation(case, device)
    assert status == expected, f"exit {status}, expected {expected}\n{stdout}"
    assert set(range(1, 9)) <= steps.keys(), stdout  # every step of the guide has its line
    assert "DDP step 0" not in stdout, stdout  # the script's own line is no DDP step, and never says so
    for step, (verdict, code) in verdicts.items():
        assert steps[step][0] == verdict, f"step {step}: expected {verdict}\n{stdout}"
        if code:
            assert steps[step][2] == code, f"step {step}: expected {code}\n{stdout}"
    unexpected = [s for s, (v, _, _) in steps.items() if v == "FAIL" and verdicts.get(s, ("",))[0] != "FAIL"]
    assert not unexpected, f"false alarms on steps {unexpected}\n{stdout}"
    for s, (v, _, code) in steps.items():
        assert (code is not None) == (v in ("FAIL", "warn")), f"step {s}: a finding names its code\n{stdout}"
    flagged = "\n".join(text for verdict, text, _ in steps.values() if verdict in ("FAIL", "warn"))
    for name in see:
        assert f"pitfalls/{name}.py" in flagged, f"pitfall {name} not named\n{stdout}"
    # a job whose ranks were all stopped before any recorded its error (a race, seen under load: see
    # test_a_job_whose_ranks_were_stopped_before_their_error...) has no error's line to name
    unrecorded = "no rank's error recorded" in flagged
    for line in marked if any(v in ("FAIL", "warn") for v, _ in verdicts.values()) and not unrecorded else ():
        assert f"{case.name}:{line}" in flagged, f"{case.name}:{line} not named\n{stdout}"


# -----------------------------------------------------------------------------
# replayed: each case's recorded job, judged again (quick)


@pytest.mark.parametrize("case", CASES, ids=[case.stem for case in CASES])
def test_a_recorded_job_judged_again_says_what_its_case_states(case, monkeypatch):
    folder = JOBS / case.stem
    assert (folder / "job.json").is_file(), (
        f"no recorded job: python tests/record_check_ddp_jobs.py {case.stem}"
    )
    monkeypatch.setenv("CHECK_DDP_STRICT", "1")  # every record fits the schema
    job = Job.load(folder)
    verdict = judge(job)
    text, lines = report(job, verdict), verdict.lines
    status = 1 if any(line.verdict == "FAIL" for line in lines) else 0
    assert normalised(text) == (folder / "report.txt").read_text().strip(), (
        "the report differs from the one recorded: if the change is meant, record it again "
        f"(python tests/record_check_ddp_jobs.py {case.stem})\n{text}"
    )
    assert_says_what_the_case_states(case, status, steps_of(lines, see), text, device=job.device)


def test_the_recorded_jobs_were_recorded_by_todays_recorder():
    """A job recorded before the watcher changed what it records (a record kind, a field, a call
    watched) may lack what today's rules read: record it again."""
    stale = [case.stem for case in CASES if Job.made_by(JOBS / case.stem) != (FORMAT, recorder())]
    assert not stale, f"re-record: python tests/record_check_ddp_jobs.py {' '.join(stale)}"


def test_a_crash_that_only_the_wrappers_keys_explain_names_the_fix_at_the_save():
    """A checkpoint of the DDP wrapper's keys (module.) loaded into a bare model fails with missing and
    unexpected keys: the FAIL says the keys are the wrapper's, and that the fix is at the save."""
    job = Job.load(JOBS / "imagenet_resume_crash")
    lines = steps_of(judge(job).lines, see)
    assert lines[6][0] == "FAIL"
    assert "the DDP wrapper's: save model.module.state_dict() (DDP603)" in lines[6][1], lines[6][1]


def test_the_step_dcps_state_dict_api_takes_is_not_counted_as_the_scripts():
    """get_optimizer_state_dict() makes an optimizer's state by a step of no gradients of its own: the
    script's loop ran 8 optimizer steps (256 samples a rank, batch 32, one epoch, then the save fails)."""
    job = Job.load(JOBS / "fsdp2_optimizer_before_shard_dcp")
    assert [e["n"] for _, e in job.records("step", rank=0)] == list(range(1, 9))
    assert "after 8 optimizer steps" in steps_of(judge(job).lines, see)[4][1]


def test_a_job_whose_ranks_were_stopped_before_their_error_is_judged_as_its_case_states():
    """A race seen live, under load: gloo aborts rank 1 of mnist_uneven_split (sizes that differ), and
    torchrun stops rank 0 before rank 0 records its own error, so that no rank's error is recorded.
    Its recorded job, less rank 0's error and end, is that job: judged as the case states, its step 3
    saying where each rank was last, and its step 5 not checked (the job stopped before an epoch's end)."""
    case = next(c for c in CASES if c.stem == "mnist_uneven_split")
    job = Job.load(JOBS / case.stem)
    assert [e["e"] for e in job.ranks[0]].count("crash") == 1
    assert not [
        e for e in job.ranks[1] if e["e"] in ("crash", "exit")
    ]  # aborted by gloo: no error of Python's
    job.ranks[0] = [e for e in job.ranks[0] if e["e"] not in ("crash", "exit")]
    verdict = judge(job)
    text, lines = report(job, verdict), verdict.lines
    status = 1 if any(line.verdict == "FAIL" for line in lines) else 0
    assert_says_what_the_case_states(case, status, steps_of(lines, see), text, device=job.device)
    steps = steps_of(lines, see)
    assert re.search(r"rank 0 was last in .* at mnist_uneven_split\.py:\d+", steps[3][1]), text
    assert re.search(r"rank 1 was last in .* at mnist_uneven_split\.py:\d+", steps[3][1]), text
    assert steps[5][0] == "--", text


@pytest.mark.parametrize("case, verdict", [("trainer_ok", "--"), ("course_manual_sgd_no_set_epoch", "FAIL")])
def test_a_job_stuck_freeing_its_ddp_model_is_a_step_7_finding_on_gloo_only(case, verdict):
    """A race seen live (a real course's script, 4 runs of 9): torch 2.13's gloo can hang as a process
    frees its DDP model at exit (pytorch#190489), every rank done. A recorded job, its rank 1 made to
    hang there as the check finds it (its end never recorded): a GPU script's job (nccl, gloo standing
    in) is not checked at step 7, since its nccl job never runs that code; a gloo script's hangs for
    real: DDP701. Either way no other step FAILs for it (it is no hang in a collective, step 5's)."""
    job = Job.load(JOBS / case)
    assert job.records("ddp_freed", rank=1) and job.records("exit", rank=1)
    recorded = steps_of(judge(job).lines, see)
    job.ranks[1] = [e for e in job.ranks[1] if e["e"] != "exit"]
    job.stuck_at_exit = True
    steps = steps_of(judge(job).lines, see)
    assert steps[7][0] == verdict and "while freeing the DDP model" in steps[7][1], steps[7]
    assert steps[7][2] == ("DDP701" if verdict == "FAIL" else None)
    assert {s: v[0] for s, v in steps.items() if s != 7} == {s: v[0] for s, v in recorded.items() if s != 7}


def test_a_launch_of_the_scripts_own_found_in_a_run_again_is_the_cause_of_what_the_runs_before_it_found():
    """Seen on a real mpiexec script (its rank from mpi4py, a port of its own): the first run FAILs its
    MASTER_PORT (DDP101: the ranks never met), and only the run again with that set aside reaches its
    read of PMI_RANK (DDP807, a launch of another launcher's). The port is that launcher's way to meet:
    one cause, one FAIL, at step 8, wherever the launch was seen. (Lines as judge() combines them: the
    first run's stopper, the run again's root and its other steps.)"""
    from check_ddp.judge.registry import Line
    from check_ddp.verdict import consequences

    port = Line(1, "FAIL", "dist_util.py:40 sets MASTER_PORT=47809, over torchrun's 38507", "DDP101", run=0)
    launch = Line(8, "FAIL", "logger.py:407 looks for PMI_RANK", "DDP807", run=1)
    sampled = Line(3, "ok", "DistributedSampler: disjoint shards", run=2)
    lines = consequences([port, sampled, launch])
    assert [(x.step, x.verdict) for x in lines] == [(1, "--"), (3, "ok"), (8, "FAIL")]
    assert lines[0].message.startswith("follows from DDP step 8: dist_util.py:40")


def test_a_forward_through_ddp_on_rank_0_alone_is_found_when_no_rank_says_why_the_job_ended():
    """Seen on a real VQ-VAE script: rank 0's extra DDP forward (its buffers' broadcast) put its
    collectives one ahead, gloo aborted rank 1 on the sizes that then differed (SIGABRT, no Python
    error), and torchrun stopped rank 0 before it said anything. The recorded job, less every rank's
    error and end, is that job: the first divergence, rank 0's forward through DDP that the other
    rank never makes, is the cause (DDP1001), told by the records alone."""
    case = next(c for c in CASES if c.stem == "vqvae_rank0_sample_through_ddp")
    job = Job.load(JOBS / case.stem)
    assert [e.get("through") for _, e in job.records("eval", rank=0)][:1] == ["ddp"]
    assert not job.records("eval", rank=1)
    for rank in job.ranks:
        job.ranks[rank] = [e for e in job.ranks[rank] if e["e"] not in ("crash", "exit")]
    steps = steps_of(judge(job).lines, see)
    assert steps[10][0] == "FAIL" and steps[10][2] == "DDP1001", steps[10]
    assert "no rank's error recorded" in steps[10][1], steps[10]
    assert "Rank 0 evaluated through the DDP model" in steps[10][1], steps[10]


PEER_WENT = "Connection closed by peer"


@pytest.mark.parametrize(
    "case",
    sorted(
        c.stem
        for c in CASES
        if any(PEER_WENT in line for p in (JOBS / c.stem).glob("rank*.jsonl") for line in p.open())
    ),
)
def test_gloos_other_words_for_a_lost_peer_are_judged_alike(case):
    """A race seen live, under load (CI): of two ranks that wait on each other, whichever gives up
    first times out, and the other reads that its peer went, in gloo's words either "Connection
    closed by peer" or "Application timeout caused pair closure". A recorded job's lost-peer error,
    worded the other way, is judged as recorded: a rank's error that only says its peer went is no
    cause of its own (judged one, four cases had a false DDP000, at step 4 or 5)."""
    job = Job.load(JOBS / case)
    recorded = {step: (v, code) for step, (v, _, code) in steps_of(judge(job).lines, see).items()}
    reworded = 0
    for events in job.ranks.values():
        for e in events:
            if e["e"] == "crash" and PEER_WENT in e["message"]:
                e["message"] = "[gloo/transport/tcp/pair.cc:553] Application timeout caused pair closure"
                reworded += 1
    assert reworded, f"{case}: no rank's error says its peer went"
    judged = {step: (v, code) for step, (v, _, code) in steps_of(judge(job).lines, see).items()}
    assert judged == recorded


def test_a_gpu_machine_judges_every_recorded_job_as_it_ran(monkeypatch):
    """A job is judged by what its records say of the machine it ran on, never by the machine that
    judges it: every recorded job (each ran on a CPU) gives the report recorded, where the judging
    process sees 8 GPUs (simulated here: torch.cuda answers so, and no CUDA_VISIBLE_DEVICES hides
    them). The `gpu:` part of a case is for a job that ran on GPUs: titan_global_rank_device's, which
    passes there, fails here, as it ran."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    differ = []
    for case in CASES:
        job = Job.load(JOBS / case.stem)
        if normalised(report(job, judge(job))) != (JOBS / case.stem / "report.txt").read_text().strip():
            differ.append(case.stem)
    assert not differ, f"judged otherwise where the judge sees GPUs: {differ}"
    case = next(c for c in CASES if c.stem == "titan_global_rank_device")  # gpu: exit 0, cpu: FAIL step 2
    job = Job.load(JOBS / case.stem)
    verdict = judge(job)
    lines, status = verdict.lines, verdict.status
    assert job.device == "cpu" and status == 1
    text = report(job, verdict)
    assert_says_what_the_case_states(case, status, steps_of(lines, see), text, device=job.device)


def test_every_rule_has_a_code_an_explanation_and_a_case():
    codes = list(RULES)
    assert len(codes) == len(set(codes))
    for code, rule in RULES.items():
        assert re.fullmatch(r"DDP(\d{1,2})\d\d", code) and rule.step == int(code[3:-2]), code
        assert rule.verdict in ("FAIL", "warn") and rule.help, code
        summary, _, body = rule.doc.partition("\n\n")
        assert summary and "\n" not in summary and len(body.split()) >= 15, (
            f"{code}: a summary line, then why"
        )
        assert rule.see is None or rule.see in PITFALLS, code
    assert set(SUMMARIES) == set(STEPS)
    reached = {code for case in CASES for _, code in expectation(case)[1].values() if code}
    assert reached <= set(codes), f"cases name codes that do not exist: {reached - set(codes)}"
    assert len(UNREACHED) <= 12, "UNREACHED only shrinks: a new rule comes with its case"
    assert set(codes) - reached == set(UNREACHED), (
        "UNREACHED must list exactly the codes no case reaches: "
        f"reached now {sorted(set(UNREACHED) & reached)}, "
        f"new and unreached {sorted(set(codes) - reached - set(UNREACHED))}"
    )


# The rules README.md states for the ten steps (its list, "Convert your own script"), each with the findings
# that catch a script breaking it; a rule one process breaks too, with no DDP in it, says so instead
README_RULES = [
    (1, "`dist.init_process_group` in every process", {"DDP103", "DDP104", "DDP107"}),
    (
        1,
        "never set `MASTER_ADDR`, `MASTER_PORT` or `RANK` yourself",
        {"DDP101", "DDP102", "DDP105", "DDP106"},
    ),
    (2, "The GPU of its `LOCAL_RANK`, never of its global rank", {"DDP201", "DDP202", "DDP203"}),
    (2, "on a CPU, the CPU", {"DDP204", "DDP205"}),
    (2, "It comes first in the code", {"DDP206"}),
    (3, "The same seeded dataset on every rank", {"DDP302", "DDP306", "DDP308"}),
    (3, "instead of `shuffle=True`", {"DDP303", "DDP304"}),
    (3, "`sampler.set_epoch(epoch)` at the top of every epoch", {"DDP305"}),
    (4, "`DDP(model, device_ids=...)` once the model is on its device", {"DDP204", "DDP403", "DDP404"}),
    (4, "with any checkpoint loaded", {"DDP615"}),
    (4, "`None` on a CPU", {"DDP205"}),
    (5, "Sum loss x samples on the device and count the samples", "one process's rule too: the baseline's"),
    (5, "all-reduce both, in one tensor, once an epoch", {"DDP506"}),
    (5, "its `.item()` every batch stalls a GPU", {"DDP505"}),
    (6, "Rank 0 alone writes", {"DDP602", "DDP610", "DDP612", "DDP616"}),
    (6, "from `model.module`", {"DDP603", "DDP604", "DDP608"}),
    (6, "every rank loads the same checkpoint, before the wrap", {"DDP615"}),
    (6, "Never put a collective inside `if dist.get_rank() == 0:`", {"DDP609"}),
    (7, "Every rank calls `dist.destroy_process_group()` at the end", {"DDP702"}),
    (8, "One process per GPU", {"DDP203", "DDP801", "DDP805", "DDP807", "DDP808"}),
    (9, "run the first K-1 backward passes inside `model.no_sync()`", {"DDP901", "DDP902"}),
    (10, "Each rank evaluates every N-th held-out (validation) sample", {"DDP1003", "DDP1005", "DDP1008"}),
    (10, "on `model.module` (the wrapper's forward can be a collective)", {"DDP1001"}),
    (10, "then one all-reduce of (sum, count)", {"DDP1003", "DDP1006", "DDP1009"}),
    (10, "each sample counted once", {"DDP1004", "DDP1008"}),
]


def test_every_rule_the_readme_states_has_a_finding_that_a_case_reaches():
    """Each rule of README.md's ten steps is caught by findings of check_ddp's, at least one of which a
    case of ours breaks on purpose (or the rule is one process's too, and says why it is no DDP
    finding); every step has its rules listed."""
    from test_readme import readme_steps

    steps = readme_steps()
    reached = {code for case in CASES for _, code in expectation(case)[1].values() if code}
    for step, phrase, codes in README_RULES:
        assert phrase in steps[step][1], f"README.md's DDP step {step} no longer says {phrase!r}"
        if isinstance(codes, str):  # a rule of one process too: no DDP finding, and why
            continue
        assert codes <= set(RULES), f"step {step}, {phrase!r}: no such codes {codes - set(RULES)}"
        assert codes & reached, f"step {step}, {phrase!r}: no case breaks it ({sorted(codes)})"
    assert {step for step, _, _ in README_RULES} == set(steps)


def test_explain_lists_every_code_and_explains_each():
    listing = run([sys.executable, str(CHECK), "--explain"], cwd=ROOT).stdout
    listed = [line.split()[0] for line in listing.splitlines()[1:]]
    assert sorted(listed) == sorted(RULES) and len(listed) == len(RULES)
    assert [int(line.split()[2]) for line in listing.splitlines()[1:-1]] == sorted(
        int(line.split()[2]) for line in listing.splitlines()[1:-1]
    )  # by step (DDP000, any step, last)
    page = run([sys.executable, str(CHECK), "--explain", "ddp305"], cwd=ROOT).stdout
    assert page.startswith("DDP305 (FAIL, step 3, shard the data)") and "set_epoch" in page
    assert "see:  pitfalls/step3_missing_set_epoch.py" in page
    proc = run([sys.executable, str(CHECK), "--explain", "DDP999"], cwd=ROOT, expect=2)
    assert "DDP999: no such code" in proc.stderr


def test_the_order_the_rules_are_tried_in_is_declared_and_no_code_is_used_elsewhere():
    """Each step's rules are tried in the order ORDER declares (and AT_THE_END's, once every step has
    its line): every rule once, under its own step. No code is named anywhere else in check_ddp's code
    (a rule, its order, the retired codes): the facts say what happened, the rules what it means."""
    import ast

    ordered = [code for step, codes in ORDER.items() for code in codes]
    assert sorted(ordered + list(AT_THE_END)) == sorted(RULES), "ORDER and AT_THE_END: every rule, once"
    assert all(RULES[code].step == step for step, codes in ORDER.items() for code in codes)
    assert set(ORDER) == set(STEPS)
    elsewhere = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        allowed = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and any(
                getattr(t, "id", "") in ("ORDER", "AT_THE_END", "RETIRED") for t in node.targets
            ):
                allowed |= {id(n) for n in ast.walk(node)}
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "rule" and node.args:
                allowed.add(id(node.args[0]))
        codes = [
            n for n in ast.walk(tree) if isinstance(n, ast.Constant) and re.fullmatch(r"DDP\d+", str(n.value))
        ]
        elsewhere += [(path.name, node.lineno, node.value) for node in codes if id(node) not in allowed]
    assert not elsewhere, f"codes named outside their rule and the order: {elsewhere}"


def test_each_rule_is_in_its_steps_module_in_the_order_it_is_tried():
    """A reader finds a rule where ORDER tries it: DDP step N's rules in rules/stepN_*.py, declared in
    ORDER's order, and AT_THE_END's in rules/at_the_end.py."""
    modules = {
        int(re.match(r"step(\d+)_", p.name).group(1)): p for p in (PACKAGE / "rules").glob("step*_*.py")
    }
    assert set(modules) == set(STEPS), sorted(modules)
    for step, path in [*sorted(modules.items()), (None, PACKAGE / "rules" / "at_the_end.py")]:
        declared = re.findall(r'^@rule\(\s*"(DDP\d+)"', path.read_text(), re.M)
        expected = list(ORDER[step]) if step else list(AT_THE_END)
        assert declared == expected, f"{path.name} declares {declared}, ORDER tries {expected}"


def test_a_retired_code_says_what_replaced_it_and_no_page_names_one():
    """A code is never reused, and one that is gone still explains itself: --explain OLD says where it
    went. The pages, the notebook and the cases name live codes only."""
    assert not set(RETIRED) & set(RULES)
    for old in RETIRED:
        page = run([sys.executable, str(CHECK), "--explain", old], cwd=ROOT).stdout
        assert page.startswith(f"{old}: ") and ("moved to DDP" in page or "retired:" in page), page
        moved = re.search(r"moved to (DDP\d+)", page)
        assert not moved or moved.group(1) in RULES, page
    tracked = run(["git", "ls-files"], cwd=ROOT).stdout.split()
    pages = [p for p in tracked if not p.startswith(("tests/check_ddp_jobs/", "check_ddp/"))]
    pages = [
        p for p in pages if not p.startswith("tests/test_") and (ROOT / p).suffix in (".md", ".py", ".ipynb")
    ]
    named = {(p, code) for p in pages for code in re.findall(r"\bDDP\d{3,4}\b", (ROOT / p).read_text())}
    unknown = sorted((p, code) for p, code in named if code not in RULES)
    assert not unknown, f"pages that name codes that do not exist: {unknown}"


@pytest.mark.slow
def test_pip_install_gives_a_check_ddp_command_that_checks_train_ddp_from_a_fresh_venv(tmp_path):
    """The checker installed as a package, as a learner installs it into a project of theirs: `pip
    install` of this project into a fresh venv (torch made visible to it, as the learner's own is) gives
    a check-ddp command, which checks train_ddp.py all-ok from the script's own folder; installed
    alone, without the project beside it, every see: it prints still leads somewhere."""
    source = tmp_path / "project"  # what the install reads (pip would write its build folder in place)
    shutil.copytree(PACKAGE, source / "check_ddp", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", source / "pyproject.toml")
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", str(venv)], cwd=tmp_path, timeout=120)
    (venv / "lib").glob("python*/site-packages").__next__().joinpath("torch_of_the_tests.pth").write_text(
        str(Path(torch.__file__).parent.parent) + "\n"
    )
    # as a learner installs it: pip builds it with setuptools from the package index, as the set-up does
    run([str(venv / "bin" / "python"), "-m", "pip", "install", str(source)], cwd=tmp_path, timeout=300)
    command = str(venv / "bin" / "check-ddp")
    (tmp_path / "mine").mkdir()
    work = copy_scripts(tmp_path / "mine")
    proc = run(
        [command, "--format", "json", "train_ddp.py", "--epochs", "2"], cwd=work, env=cpu_env(), timeout=300
    )
    steps = steps_of(json.loads(proc.stdout)["findings"])
    assert {step: verdict for step, (verdict, _, _) in steps.items()} == dict.fromkeys(
        [*range(1, 9), 10], "ok"
    )
    judged = run([command, "--judge", str(JOBS / "mnist_no_set_epoch")], cwd=tmp_path, expect=1).stdout
    sees = [line.strip() for line in judged.splitlines() if line.strip().startswith("see:")]
    assert sees == ["see:  check-ddp --explain DDP305"], judged
    page = run([command, "--explain", "DDP305"], cwd=tmp_path).stdout
    assert "pitfalls/step3_missing_set_epoch.py, in the project check_ddp comes from" in page


def test_a_check_run_from_another_folder_gives_see_commands_that_work_there(tmp_path):
    """A learner checks a script of theirs from its own folder (python PATH/check_ddp.py train.py):
    the pitfall and the --explain command its see: gives both work from there, as typed."""
    folder = tmp_path / "mine" / "elsewhere"
    folder.mkdir(parents=True)
    command = [sys.executable, os.path.relpath(CHECK, folder), "--judge", str(JOBS / "mnist_no_set_epoch")]
    proc = run(command, cwd=folder, expect=1)
    sees = [line.strip() for line in proc.stdout.splitlines() if line.strip().startswith("see:")]
    pitfall, explain = sees[0].removeprefix("see:").strip().split("; ")
    assert (folder / pitfall).is_file(), proc.stdout
    program, *args = explain.split()
    assert program == "python", explain
    page = run([sys.executable, *args], cwd=folder).stdout
    assert page.startswith("DDP305"), page


def test_judge_refuses_a_folder_that_is_not_a_job(tmp_path):
    proc = run([sys.executable, str(CHECK), "--judge", str(tmp_path)], cwd=tmp_path, expect=2)
    assert "not the folder of a job" in proc.stderr


def test_judge_refuses_a_job_of_another_recorder_in_one_line(tmp_path):
    """A job folder sent with a question may come from another version: judged by rules that read
    other records it would be judged wrong, so --judge says so, in one line, and judges nothing."""
    folder = shutil.copytree(JOBS / "mnist_ok", tmp_path / "job")
    saved = json.loads((folder / "job.json").read_text())
    (folder / "job.json").write_text(json.dumps({**saved, "recorder": "0123456789ab"}))
    proc = run([sys.executable, str(CHECK), "--judge", str(folder)], cwd=tmp_path, expect=2)
    assert proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "recorded by another version" in proc.stderr, proc.stderr
    assert "check the script again" in proc.stderr


# -----------------------------------------------------------------------------
# live: check_ddp.py runs each case under torchrun (the slow tier)


@pytest.fixture(scope="module")
def reports(request, tmp_path_factory):
    """Every case this session tests checked once, each in a folder of its own, three at a time:
    much of a check is waiting (torchrun's start-up, a hang's --silence), which the others fill.
    The fixture hands out each check's future; a test waits for its own."""
    with ThreadPoolExecutor(max_workers=3) as pool:
        futures = {}
        chosen = [
            params["case"]
            for test in (
                test_check_ddp_on_a_script_in_another_style,
                test_the_watcher_changes_nothing_a_script_prints,
            )
            for params in selected(request, test)
        ]
        chosen += [
            CASES_DIR / f"{p['case']}.py"
            for p in selected(request, test_the_watcher_records_today_what_it_recorded)
        ]
        for case in dict.fromkeys(chosen):
            folder = tmp_path_factory.mktemp(case.stem)
            shutil.copy(case, folder / case.name)
            futures[case.stem] = pool.submit(check, case.name, cwd=folder, expect=None)
        yield futures


def watcher_paths(folder):
    """The paths of the watcher (and the stand-in) that a recorded job took: each kind of record it
    wrote, with the values that chose the way it was recorded (how a GPU was asked for, which
    collective, who raised a crash, how a file was written, which sampler), and how the job ended."""
    taken = set()
    for path in Path(folder).rglob("rank*.jsonl"):
        for line in path.read_text().splitlines():
            e = json.loads(line)
            taken.add((e["e"], variant(e)))
    ending = json.loads((Path(folder) / "job.json").read_text())
    return taken | {("job", name) for name in ("hung", "stuck_at_exit", "then") if ending.get(name)}


def variant(e):
    """What of a record chose the watcher's path to it, by its kind."""
    kind = e["e"]
    if kind == "gpu":
        return e["how"], bool(e.get("refused"))
    if kind == "coll":
        return e["name"], e.get("group") is not None
    if kind == "crash":
        return e.get("raised"), bool(e.get("call")), bool(e.get("within")), bool(e.get("path"))
    if kind == "write":
        return e["how"], e.get("mode")
    if kind == "spawn":
        return e["how"].split("(")[0]
    if kind == "loader":
        return e["sampler"], bool(e["distributed"]), e["data"] is None, e["length"] is None
    if kind == "read":
        return e["key"] in ("LOCAL_RANK", "RANK", "WORLD_SIZE"), e["by"], e["found"]
    if kind == "save":
        return bool(e.get("unsafe")), e["path"] is None
    if kind == "load":
        return e["weights_only"], bool(e.get("shared"))
    if kind == "compile":
        return e["how"], e["wraps_ddp"]
    if kind == "ddp":
        return e["compiled"], e["compiled_inside"], e["find_unused_parameters"]
    if kind == "batch":
        return e["idx"] is None
    if kind == "fault":
        return e["type"]
    return None


def live_cases(cases):
    """Of cases, those checked live (the slow tier): each one's recorded job took a path of the watcher
    that no case chosen before it took, chosen greedily, most paths first; every other case's recorded
    job is judged in the quick tier. A new case that takes a new path is chosen by itself."""
    recorded = [case for case in cases if (JOBS / case.stem / "job.json").is_file()]
    paths = {case: watcher_paths(JOBS / case.stem) for case in recorded}
    chosen, covered = [], set()
    while True:
        case = max(paths, key=lambda c: (len(paths[c] - covered), c.stem == "mnist_ok"), default=None)
        if case is None or not paths[case] - covered:
            return sorted(chosen)
        chosen.append(case)
        covered |= paths.pop(case)


LIVE = live_cases(CASES)


def test_the_cases_checked_live_take_every_path_any_recorded_job_took():
    """Live checks cost minutes; each path of the watcher is still taken live by some case, and every
    case is judged from its recording."""
    taken = set().union(*(watcher_paths(JOBS / case.stem) for case in CASES))
    assert set().union(*(watcher_paths(JOBS / case.stem) for case in LIVE)) == taken
    assert len(LIVE) < len(CASES)


# live, the cases whose watcher paths no other case takes (LIVE), in the slow tier: the quick tier
# watches live only train_ddp.py and the README's conversion (above), and the watcher in one process
# (test_check_ddp_watcher.py); it judges every case's recorded job, in milliseconds, so that every rule is
# checked on every change
@pytest.mark.slow
@pytest.mark.parametrize("case", LIVE, ids=[case.stem for case in LIVE])
def test_check_ddp_on_a_script_in_another_style(reports, case):
    proc, report = reports[case.stem].result()
    assert_says_what_the_case_states(case, proc.returncode, steps_of(report["findings"]), proc.stdout)
    # what the job left is enough to judge it again: the same report, from its folder alone
    command = [sys.executable, str(CHECK), "--format", "json", "--judge", str(job_folder(report))]
    again = run(command, cwd=ROOT, expect=None)
    assert again.returncode == proc.returncode
    said = lambda findings: [(f["step"], f["verdict"], f["code"], f["message"]) for f in findings]  # noqa: E731
    assert said(json.loads(again.stdout)["findings"]) == said(
        report["findings"]
    )  # (see: is relative to where)


# What the watcher records today, against what it recorded for tests/check_ddp_jobs/: the replays above
# judge the recordings, so a watcher that records otherwise must be recorded again. A sample of the
# cases that end well, compared record by record, what changes from run to run masked.
RECORDED_SAMPLE = ["mnist_ok", "trainer_ok", "titan_ok", "references_ok", "detectron_infinite_sampler_ok"]


def as_recorded(folder):
    """Each rank's records, as a run of the same job would record them again: without where the main
    thread was twice a second, the port torchrun picked, the seconds, the folders files were in, and
    the weights' values at the end (an unseeded model starts anywhere; DDP makes the ranks alike)."""
    masked = {}
    for path in sorted(Path(folder).glob("rank*.jsonl")):
        records = []
        for line in path.read_text().splitlines():
            e = json.loads(line)
            if e["e"] in ("now", "ddp_freed"):  # twice a second; freed when the collector gets to it
                continue
            e.pop("seconds", None)
            if e["e"] == "exit" and e["weights"]:  # a model initialised unseeded: rank 0's, broadcast
                e["weights"] = e["weights"]["count"]
            if e["e"] == "start":
                e["env"] = {k: v for k, v in e["env"].items() if not k.startswith("MASTER")}
            for key in ("path", "source"):
                if isinstance(e.get(key), str):
                    e[key] = Path(e[key]).name
            records.append(e)
        masked[path.name] = records
    return masked


@pytest.mark.slow
@pytest.mark.parametrize("case", RECORDED_SAMPLE)
def test_the_watcher_records_today_what_it_recorded(reports, case):
    _, report = reports[case].result()
    today, recorded = as_recorded(job_folder(report)), as_recorded(JOBS / case)
    assert today == recorded, (
        f"the watcher records otherwise now: re-record (python tests/record_check_ddp_jobs.py {case})"
    )


# The cases that run as CPU code too (plain torchrun, no GPU: CPU-aware, or CPU code), and end well
# under the check: not those whose GPU branch, stood in, fails by design (the script's own error,
# DDP000), as mnist_accel_kwargs_shuffle's GPU loader options do
CPU_AWARE = (
    "course_manual_sgd_no_set_epoch",
    "course_every_rank_evaluates_by_hand",
    "ema_copies_and_pickles_ok",
)
CPU_CASES = [
    case
    for case in CASES
    if (
        case.stem.startswith("mnist_")
        and case.stem != "mnist_no_init_process_group"
        and "uneven" not in case.stem
        or case.stem in CPU_AWARE
    )
    and "DDP000" not in case.read_text().splitlines()[0]
]
CPU_CASES = live_cases(CPU_CASES)  # of those, the ones whose watcher paths no other takes


def printed(output):
    """What a script printed, from a job's output: torchrun's own lines left out, and the clock in
    torch's own warnings ("[rank0]:[W1202 04:33:19.300932232 reducer.cpp:1529] Warning: ...") masked."""
    return [
        re.sub(r"\[([WIE])\d{4} [\d:.]+ ", r"[\1 ", line)
        for line in output.splitlines()
        if not re.match(r"[WIE]\d{4} |\*{5}|Setting OMP_NUM_THREADS", line) and line.strip()
    ]


# torch 2.13 may abort a worker as Python shuts down, after the script's last line: its gloo threads
# still alive (pytorch/pytorch#190489, which train_ddp.py works around); seen on 2026-12-02 in fresh-clone
# runs, once on mnist_legacy_local_rank and twice in a row on mnist_no_set_epoch, never under the check
SHUTDOWN_ABORT = "terminate called without an active exception"


def printed_as_it_is(case, folder):
    """What the case prints under plain torchrun: all of it, up to an abort at Python's shutdown, if
    torch aborted it there (after the script's last line: torchrun's report of it is not the script's)."""
    proc = run(
        ["torchrun", "--standalone", "--nproc_per_node=2", case.name], cwd=folder, timeout=120, expect=None
    )
    ended = proc.stderr.split(SHUTDOWN_ABORT)[0]
    assert proc.returncode == 0 or SHUTDOWN_ABORT in proc.stderr, (
        f"{case.name} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    )
    return printed(proc.stdout + ended)


@pytest.mark.slow
@pytest.mark.parametrize("case", CPU_CASES, ids=[case.stem for case in CPU_CASES])
def test_the_watcher_changes_nothing_a_script_prints(reports, case, tmp_path):
    """An observer is judged by what it does not change: each CPU case, run as it is under torchrun
    and run under check_ddp.py (watched, its GPU branch stood in where it has one), prints the very
    same lines, its losses to the last digit among them."""
    _, report = reports[case.stem].result()
    shutil.copy(case, tmp_path / case.name)
    plain = printed_as_it_is(case, tmp_path)
    watched = (job_folder(report) / "output.log").read_text()
    assert plain, "the case prints nothing to compare"
    assert sorted(printed(watched)) == sorted(plain)


def test_the_readmes_conversion_in_its_gpu_form_passes_on_a_cpu(tmp_path):
    """The GPU script the README's conversion makes of the notebook's exercise (nccl, cuda:LOCAL_RANK,
    set_device, device_ids), checked where there is no GPU: stood in, every step the CPU can judge
    is judged, and ok, its evaluation (a DataLoader of each rank's Subset) exact."""
    (tmp_path / "my_train.py").write_text(readme_conversion(notebook_exercise()))  # as a learner makes it
    proc, report = check("my_train.py", cwd=tmp_path, expect=0)
    steps = steps_of(report["findings"])
    assert (
        report["how"]
        == "2 processes as 2 nodes of 1, GPU script stood in on the CPU: cuda -> cpu, nccl -> gloo"
    )
    assert {step: verdict for step, (verdict, _, _) in steps.items()} == dict.fromkeys(
        [*range(1, 9), 10], "ok"
    ), proc.stdout
    assert "rank 1 on cuda:0 of node 1" in steps[2][1], proc.stdout  # the second node's own GPU 0
    assert "each once" in steps[10][1], proc.stdout
    assert (tmp_path / "ckpt.pt").exists()  # the job ran for real


def as_it_reads_anywhere(report):
    """A check's report without what changes from run to run: its times, its job's folder, and the
    way its lines wrap around them."""
    report = re.sub(r"\n +", " ", report.strip())  # each step's line whole
    report = re.sub(r"\S*(pitfalls/\w+\.py)", r"\1", report)  # the pitfalls as the project names them
    report = re.sub(r"python \S*check_ddp\.py --explain", "python check_ddp.py --explain", report)
    report = re.sub(r"\b\d+\.\d s\b", "N s", report)
    return re.sub(r"/\S*check_ddp-\w+/", "FOLDER/", report)


# The README's sample report: its command, and the report it shows, as a kept job of that command
# (tests/readme_report_job/, python tests/record_check_ddp_jobs.py --readme) judges them again
README_REPORT = re.compile(r"<!-- check-report -->\n```text\n\$ python (check_ddp\.py .*?)\n(.*?)```", re.S)
README_JOB = ROOT / "tests" / "readme_report_job"


def readme_report(folder):
    """Run the README's sample check as the README says, in folder: train_ddp.py less its set_epoch
    line, as my_train.py. Its process, and the report the README shows."""
    script = (ROOT / "train_ddp.py").read_text().splitlines(keepends=True)
    (folder / "my_train.py").write_text("".join(line for line in script if "sampler.set_epoch(" not in line))
    command, shown = README_REPORT.search((ROOT / "README.md").read_text()).groups()
    argv = [sys.executable, str(CHECK), *command.split()[1:]]
    return run(argv, cwd=folder, env=cpu_env(), expect=1, timeout=150), shown


@pytest.mark.slow
def test_the_readmes_report_is_what_a_real_check_prints(tmp_path):
    """The README's sample report, whole: train_ddp.py less its set_epoch line, checked as the
    README says, prints it, but for its times and its folder (its kept job holds those:
    test_figures.py)."""
    proc, shown = readme_report(tmp_path)
    assert as_it_reads_anywhere(shown) == as_it_reads_anywhere(proc.stdout)


def test_check_ddp_passes_our_train_ddp(tmp_path):
    """train_ddp.py takes its GPU path wherever CUDA is there, stood in here: every step is judged, ok."""
    work = copy_scripts(tmp_path)
    proc, report = check("train_ddp.py", "--epochs", "2", "--grad_accum_steps", "2", cwd=work, expect=0)
    steps = steps_of(report["findings"])
    assert {step: verdict for step, (verdict, _, _) in steps.items()} == dict.fromkeys(range(1, 11), "ok"), (
        proc.stdout
    )  # 9 and 10 too: it accumulates with no_sync, and evaluates exactly
    assert (work / "out/train_ddp/run_1/model_epoch_2.pt").exists()  # the job ran for real


def test_a_silencing_comment_that_names_no_code_is_a_usage_error_before_anything_runs(tmp_path):
    """ignore[DDP9999] is a mistake in the comment, never a silence: exit 2, saying which line, and no
    job started."""
    (tmp_path / "train.py").write_text("import os\nprint(os.getpid())  # check_ddp: ignore[DDP9999]\n")
    proc = run([sys.executable, str(CHECK), "train.py"], cwd=tmp_path, expect=2)
    assert "train.py:2: # check_ddp: ignore[DDP9999] names no code" in proc.stderr, proc.stderr
    assert not proc.stdout


def test_a_finding_the_script_silences_is_counted_and_named():
    """# check_ddp: ignore[DDP1005] on the line the finding names: the step says what else it finds (ok
    here), and the report and its JSON count and name what was ignored."""
    job = Job.load(JOBS / "course_evaluates_all_accepted")
    verdict = judge(job)
    assert [(x.step, x.verdict) for x in verdict.lines if x.step == 10] == [(10, "ok")]
    data = as_json(job, verdict)
    assert data["ignored"] == [{"code": "DDP1005", "at": "course_evaluates_all_accepted.py:30", "step": 10}]
    assert "1 finding ignored as the script asks: DDP1005 at course_evaluates_all_accepted.py:30" in report(
        job, verdict
    )


def test_a_hang_finding_says_which_of_pytorchs_own_tools_show_it_on_a_cluster():
    """A finding of ranks that wait for one another names PyTorch's own tools, as commands, and the page
    that shows what each prints (docs/troubleshooting.md, from kept runs); a finding of no hang, none."""
    hang = as_json(job := Job.load(JOBS / "trainer_barrier_in_save"), judge(job))
    (finding,) = [f for f in hang["findings"] if f["verdict"] == "FAIL"]
    for said in (
        "TORCH_DISTRIBUTED_DEBUG=DETAIL",
        "TORCH_FR_BUFFER_SIZE=",
        "flight_recorder.fr_trace",
        "monitored_barrier",
    ):
        assert said in finding["tools"], finding["tools"]
    page, _, anchor = finding["tools"].rpartition(": ")[2].partition("#")
    assert f"# {anchor.replace('-', ' ')}" in (ROOT / page).read_text().lower().replace(",", "").replace(
        "'", ""
    )
    other = as_json(job := Job.load(JOBS / "mnist_no_set_epoch"), judge(job))
    assert [f["tools"] for f in other["findings"] if f["verdict"] == "FAIL"] == [None]


def test_a_missing_script_is_a_usage_error(tmp_path):
    proc = run([sys.executable, str(CHECK), "no_such_script.py"], cwd=tmp_path, env=cpu_env(), expect=2)
    assert "no_such_script.py: no such file" in proc.stderr


def test_the_recorded_jobs_are_the_cases_and_small():
    recorded = sorted(p.name for p in JOBS.iterdir() if p.is_dir())
    assert recorded == [case.stem for case in CASES], (
        "record the jobs again: python tests/record_check_ddp_jobs.py"
    )
    size = sum(p.stat().st_size for p in JOBS.rglob("*") if p.is_file())
    # about 45 KB a case, 142 cases: a bound that grows only with cases, each recorded as small as it shows
    assert size < 7 * 2**20, f"{size} bytes of recorded jobs: keep them small"
    assert not list(JOBS.rglob("site")), "the recorded jobs keep only what the judge reads"
