"""3. judge: the rules, declared. Each rule is one finding: a code (DDP3xx for step 3's), its verdict,
its help, the pitfall that shows it, and its docstring, the explanation --explain prints. ORDER says
the order each step's rules are tried in; RETIRED, where a code that is gone went."""

import inspect
from dataclasses import dataclass


@dataclass
class Line:
    """A step's line in the report: its verdict (ok, warn, FAIL, or -- for not checked), what it
    rests on, and for a finding its rule's code, help and pitfall; what of the job's end it
    accounts for ("crash", "hang")."""

    step: int
    verdict: str
    message: str
    code: str = None
    help: str = None
    see: str = None
    explains: frozenset = frozenset()
    follows: dict = None  # {step: text}: the steps whose lines follow from this finding
    follows_across: str = None  # every finding that compares the ranks follows from this one, saying this
    run: int = 0  # the run it comes from: 0, the job; 1, the job run again, with what stopped it set aside


@dataclass
class Found:
    """What a rule returns when it finds its mistake: the message, built from the evidence, and,
    where the evidence changes them, its help and what of the job's end it explains."""

    message: str
    help: str = None
    explains: tuple = None
    follows: dict = None  # {step: what of that step follows from this finding}: those steps say so
    follows_across: str = None  # what of every finding that compares the ranks follows from this one
    step: int = None  # the step of the line, for a rule of no step of its own (AT_THE_END)
    see: str = None  # a pitfall for this finding, where the rule's is not the one that shows it
    verdict: str = None  # "--": the rule saw it, and it is not the script's mistake (not checked)


@dataclass
class Rule:
    code: str  # DDP<step><nn>: DDP306 is step 3's; DDP1003, step 10's; DDP000, a crash at any step
    step: int
    verdict: str  # FAIL or warn
    check: object  # check(facts) -> Found, or None
    help: str
    see: str  # a key of PITFALLS, or None
    explains: tuple  # "crash", "hang": what of the job's end the finding accounts for, by default
    # what a run again sets aside to check the rest (keys of SET_ASIDE), or (); "always": whether or not
    # the job stopped (else only where it did, or for a launch of the script's own)
    sets_aside: tuple
    # "root": a launch of the script's own (its processes, or who they are, not torchrun's: DDP step 8);
    # "follows": a finding that follows from such a launch, where one FAILs or was set aside (its ranks
    # never formed torchrun's job: they meet elsewhere, claim one rank, or train alone)
    launch: str
    # a finding that compares the ranks (their data, their calls, their weights): what an earlier place
    # where the ranks parted explains (a finding's follows_across)
    across: bool = False
    # a finding of ranks that wait for one another (a hang, or a rank that lost its peers): the report says
    # which of PyTorch's own tools show it on a cluster, with the commands
    hang: bool = False
    # a finding that the script's own rendezvous (where its ranks meet, who it says each is) is not
    # torchrun's: in a run made as the launcher the script was written for, it is that launcher's way to
    # meet, and the rule is not tried
    rendezvous: bool = False

    @property
    def doc(self):
        return inspect.cleandoc(self.check.__doc__ or "")


RULES = {}  # code: Rule


# The order each step's rules are tried in: the first that finds something is the step's line. Ranks
# that fell out of step come first (a hang or a lost peer explains what else looks wrong); then a
# cause before its symptoms, and a FAIL before a warn of the same evidence.
ORDER = {
    1: ("DDP101", "DDP102", "DDP108", "DDP103", "DDP104", "DDP105", "DDP106", "DDP107"),
    2: ("DDP201", "DDP202", "DDP203", "DDP204", "DDP205", "DDP206"),
    3: ("DDP307", "DDP309", "DDP301", "DDP302", "DDP303", "DDP304", "DDP305", "DDP306", "DDP308"),
    4: ("DDP401", "DDP403", "DDP404", "DDP409", "DDP405", "DDP408", "DDP406", "DDP407"),
    5: ("DDP508", "DDP506", "DDP505"),
    6: (
        "DDP615",
        "DDP609",
        "DDP614",
        "DDP611",
        "DDP601",
        "DDP602",
        "DDP612",
        "DDP610",
        "DDP616",
        "DDP603",
        "DDP608",
        "DDP604",
        "DDP605",
        "DDP606",
        "DDP607",
        "DDP613",
    ),  # fmt: skip
    7: ("DDP701", "DDP702"),
    8: ("DDP801", "DDP805", "DDP807", "DDP808", "DDP806", "DDP804"),
    9: ("DDP901", "DDP902"),
    10: ("DDP1007", "DDP1001", "DDP1002", "DDP1008", "DDP1005", "DDP1006", "DDP1009", "DDP1003", "DDP1004"),
}


# What no step's line accounts for, tried once every step has its line, in this order: a crash (its
# line at the step the rank was in), then a job the check had to stop (never a pass).
AT_THE_END = ("DDP000", "DDP504")


# Codes that existed and were retired: what a report that named one means now. A code is never
# reused; --explain OLD says where it went.
RETIRED = {
    "DDP402": "retired: SyncBatchNorm on a CPU. The stand-in runs SyncBatchNorm as BatchNorm on the CPU, "
    "so a GPU script is checked as it runs on GPUs; a CPU script of yours that uses it fails with its own "
    "error (DDP000).",
    "DDP501": "moved to DDP609 (DDP step 6): a collective inside a rank-only block, under the step the "
    "README teaches it in.",
    "DDP502": "moved to DDP307 (DDP step 3): uneven inputs, ranks with different numbers of batches.",
    "DDP503": "moved to DDP1007 (DDP step 10): ranks that leave the training loop apart (an early stop).",
    "DDP802": "retired: nccl asked for on a machine without GPUs. nccl is stood in by gloo there: the "
    "script is checked as it runs on GPUs.",
    "DDP803": "retired: a GPU asked for on a machine without GPUs. CUDA is stood in on the CPU there; what "
    "cannot be stood in is not checked (--), never the script's mistake.",
}


SUMMARIES = {}  # step: the function saying ok or -- (not checked) when no rule finds anything


# What a run again sets aside, as the report says it
SET_ASIDE = {
    "launch": "with the script's own launch variables and init_process_group() arguments set aside "
    "(torchrun's kept)",
    "layout": "as one node of all the processes",
    "launcher": "as the launcher it was written for starts it (its variables, or --local_rank, set from "
    "torchrun's)",
}


def rule(
    code,
    verdict,
    help,
    see=None,
    explains=(),
    sets_aside=(),
    launch=None,
    across=False,
    hang=False,
    rendezvous=False,
):
    """Declare a rule: the function under it looks at the facts and returns Found, or None."""

    def register(check):
        assert code not in RULES, f"{code} is taken"
        RULES[code] = Rule(
            code,
            int(code[3:-2]),
            verdict,
            check,
            help,
            see,
            tuple(explains),
            tuple(sets_aside),
            launch,
            across,
            hang,
            rendezvous,
        )
        return check

    return register


def summary(step):
    """Declare what a step says when none of its rules finds anything: (verdict, message), or None
    for no line."""

    def register(function):
        SUMMARIES[step] = function
        return function

    return register


def rule_of(line):
    return RULES.get(line.code) if line.code else None
