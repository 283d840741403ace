"""3. judge: the verdict, from what the records say. For each step, the first rule that finds
something (and that the script does not silence: # check_ddp: ignore[CODE]) is the step's line; else
the step's summary says ok, or -- for not checked. Then one cause, one FAIL: what follows from a
finding says so. The job is read, never written; each run of it is judged once."""

import re
from dataclasses import dataclass, replace

from . import rules  # noqa: F401 (every rule, registered)
from .job import runs
from .judge.crash import own_errors
from .judge.facts import Facts
from .judge.registry import AT_THE_END, ORDER, RULES, SUMMARIES, Line, rule_of
from .steps import SCRIPT, STEPS


def stopper(line):
    """A FAIL that a run again sets aside, to check the rest (RULES' sets_aside): one that stopped its
    run, or a launch of the script's own (which the run again makes as its launcher would)."""
    return line.verdict in ("FAIL", "warn") and line.code in RULES and bool(RULES[line.code].sets_aside)


@dataclass(frozen=True)
class Judged:
    """What one run of the job shows: a line per step, as found (before judge() says what follows from
    what), the findings the script silences, its silencing comments that name no code, and the rules
    of check_ddp's own that failed on it."""

    lines: tuple
    ignored: tuple
    unknown_ignores: tuple
    errors: tuple

    @property
    def stoppers(self):
        """The FAILs that stopped this run and that a run again sets aside."""
        return [line for line in self.lines if stopper(line)]


@dataclass(frozen=True)
class Verdict:
    """The job's verdict: a line per step, over every run of it; the runs, each as judged; and what the
    report says besides (findings silenced, silencing comments that name no code, check_ddp's own
    errors)."""

    lines: tuple
    runs: tuple  # each run's Judged, in order: the first, then each run again
    ignored: tuple
    unknown_ignores: tuple
    own_errors: tuple

    @property
    def status(self):
        """The exit status: 2, a silencing comment that names no code (a usage error, never a silence);
        3, check_ddp's own error (the check is incomplete); 1, a step failed; 0, none did."""
        if self.unknown_ignores:
            return 2
        if self.own_errors:
            return 3
        return 1 if any(line.verdict == "FAIL" for line in self.lines) else 0


def judge(job, judged=None):
    """The job's verdict: each run of it judged once (judged: {folder: Judged} of runs judged already);
    for a job run again with what stopped it set aside, each such finding from the run that found it,
    and every other step from the last run."""
    chain = runs(job)
    found = [(judged or {}).get(run.folder) or judge_run(run) for run in chain]
    kept = {}
    for n, run in enumerate(found[:-1]):
        for line in run.stoppers:  # the first run's, but a later run's FAIL over an earlier one's warning
            if line.step not in kept or (kept[line.step].verdict == "warn" and line.verdict == "FAIL"):
                kept[line.step] = replace(line, run=n)
    last = [replace(x, run=len(found) - 1) for x in found[-1].lines]
    for x in last:  # a step the run again FAILs says so, over a warning of the run before
        if x.step in kept and kept[x.step].verdict == "warn" and x.verdict == "FAIL":
            del kept[x.step]
    last = [x for x in last if x.step not in kept]
    # the script numbers its processes itself (a launch of its own set aside, torchrun's kept): so do its
    # samplers, whose findings follow from it (not so for a launch made as its own launcher makes it)
    launch = [
        x.step
        for x in kept.values()
        if "launch" in RULES[x.code].sets_aside and RULES[x.code].launch != "root"
    ]
    # (and where a launch of the script's own FAILs too, the numbering is that launch's: its step)
    root = [x.step for x in kept.values() if x.verdict == "FAIL" and RULES[x.code].launch == "root"]
    if launch and "launch" in chain[-1].aside:
        last = [
            Line(x.step, "--", f"follows from DDP step {min(root or launch)}: {x.message}", run=x.run)
            if RULES.get(x.code) and RULES[x.code].launch == "follows"
            else x
            for x in last
        ]
    # one cause, one FAIL, over the lines of every run: a stopper kept from the first run may follow
    # from a launch of the script's own that the run again still shows
    lines = consequences(sorted([*kept.values(), *last], key=in_order))
    return Verdict(
        tuple(lines),
        tuple(found),
        tuple(dict.fromkeys(x for run in found for x in run.ignored)),
        tuple(dict.fromkeys(x for run in found for x in run.unknown_ignores)),
        tuple(own_errors(job, [e for run in found for e in run.errors])),
    )


def judge_run(job):
    """One run of the job, judged: a line per step, the first of its rules that finds something, else
    its summary; then a crash that no line explains, at the step it happened in. The job is read, never
    written: what judging it learns is in what it returns."""
    facts = Facts(job)
    for step in STEPS:
        line = judge_step(facts, step)
        if line is not None:
            facts.lines.append(line)
            facts.explained |= line.explains
    for code in AT_THE_END:  # each puts its line at the step it names, in place of that step's
        found = tried(facts, code)
        if found is not None and not silenced(facts, code, found, found.step):
            line = finding(RULES[code], found, step=found.step)
            there = next((old for old in facts.lines if old.step == line.step), None)
            if there is not None and there.verdict == "FAIL" and line.verdict == "FAIL":
                # the step's own finding is the cause; what the job then met is said after it
                line = replace(there, message=f"{there.message}; then {line.message}")
            facts.lines = [old for old in facts.lines if old.step != line.step] + [line]
    lines = sorted(facts.lines, key=in_order)  # as found: judge() says what follows from what
    return Judged(
        tuple(lines), tuple(facts.ignored), tuple(facts.source.unknown_ignores()), tuple(facts.errors)
    )


def judge_step(facts, step):
    for code in ORDER[step]:
        if RULES[code].rendezvous and "launcher" in facts.job.aside:  # its launcher's way to meet
            continue
        found = tried(facts, code)
        if found is not None and not silenced(facts, code, found, step):
            if RULES[code].launch == "follows" and found.verdict != "--" and facts.unreached_launch:
                # ranks apart before the script's own launch: as its authors launch it, one process
                at = facts.code(facts.unreached_launch)
                return Line(
                    step,
                    "--",
                    f"not checked: the script starts its own processes at {at}, and the run never got "
                    "there: what ran before it is one process's",
                )
            return finding(RULES[code], found)
    said = SUMMARIES[step](facts)
    return Line(step, *said) if said else None


def silenced(facts, code, found, step):
    """Whether the script silences this finding: `# check_ddp: ignore[CODE]` on a line it names (a
    learner's warning accepted on purpose, as linters' noqa). Counted, and said in the report."""
    if found.verdict == "--":
        return False
    named = re.findall(r"[\w./-]+\.py:\d+", found.message)
    at = next((a for a in named if code in facts.source.ignores().get(a, ())), None)
    entry = (code, at, found.step if found.step is not None else step)
    if at is not None and entry not in facts.ignored:
        facts.ignored.append(entry)
    return at is not None


def tried(facts, code):
    """A rule's finding; a rule that fails is check_ddp's own error, said as such (never the script's),
    and finds nothing."""
    try:
        return RULES[code].check(facts)
    except Exception as error:  # noqa: BLE001
        facts.errors.append(f"{code}: {type(error).__name__}: {error}")
        return None


def finding(rule, found, step=None):
    explains = rule.explains if found.explains is None else found.explains
    if found.verdict == "--":  # the rule declines to judge: what it saw is not the script's to answer for
        return Line(step or rule.step, "--", found.message, explains=frozenset(explains))
    return Line(
        step or rule.step, rule.verdict, found.message, rule.code, found.help or rule.help,
        found.see or rule.see, frozenset(explains), found.follows, found.follows_across,
    )  # fmt: skip


def in_order(line):
    """The steps in order, the script's own error (step 0, no DDP step's) after them."""
    return (line.step == SCRIPT, line.step)


def consequences(lines):
    """One cause, one FAIL: a finding that says which later or earlier steps follow from it turns
    those steps' lines (unless ok) into `--`, saying so: the step whose change fixes it is the one
    that FAILs. A launch of the script's own (RULES' launch "root") is the cause of every finding that
    follows from one (launch "follows"): its ranks never formed the job torchrun made. A finding speaks
    for its own run only: a run again, with what stopped the first set aside (or made as its own
    launcher makes it), is judged on what it shows."""
    roots = {(line.run, step): (line, text) for line in lines for step, text in (line.follows or {}).items()}
    launch = next(
        (x for x in lines if x.verdict == "FAIL" and rule_of(x) and rule_of(x).launch == "root"), None
    )
    if launch:  # the launch is the cause of what follows from it, and of what those findings say follows
        followers = {
            (x.run, x.step)
            for x in lines
            if x.verdict in ("FAIL", "warn")
            and rule_of(x)
            and rule_of(x).launch == "follows"
            and x.run <= launch.run  # its run, or one before it whose stopper hid it
        }
        roots = {
            (line.run, step): (line, text)
            for line in lines
            if (line.run, line.step) not in followers
            for step, text in (line.follows or {}).items()
        }
        roots |= {key: (launch, (launch.follows or {}).get(key[1], "")) for key in followers}
    # the first place the ranks parted: every finding that compares them, after it, follows from it
    for root in (x for x in lines if x.follows_across and x.verdict == "FAIL"):
        for x in lines:
            if x.run == root.run and x is not root and x.verdict in ("FAIL", "warn") and rule_of(x).across:
                roots.setdefault((x.run, x.step), (root, root.follows_across))
    out = []
    for line in lines:
        root = roots.get((line.run, line.step))
        # a line that is ok stays ok, unless the finding says what of it follows (its text)
        if root and (line.verdict != "ok" or root[1]) and root[0] is not line:
            text = root[1] or line.message
            line = Line(
                line.step,
                "--",
                f"follows from DDP step {root[0].step}: {text}",
                explains=line.explains,
                run=line.run,
            )
        out.append(line)
    return out
