"""How the code reads: the twin diff shows only named DDP steps, the FSDP twin's diff only named FSDP
steps, the lint is clean, and the tools are the versions requirements.txt pins."""

import ast
import difflib
import importlib.metadata
import re
import subprocess
import sys
from types import SimpleNamespace

import torch.distributed.checkpoint.filesystem
from helpers import ROOT, SCRIPTS
from test_twins import numbered_code_lines

STEP = re.compile(r"(?<!FS)DDP step (\d+)\b")
FSDP_STEP = re.compile(r"FSDP step (\d+)\b")


def twin_diff_hunks(old="single_gpu_baseline.py", new="train_ddp.py"):
    proc = subprocess.run(["diff", "-u", old, new], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 1, proc.stderr  # 1: the files differ
    hunks = re.split(r"^@@.*@@.*$", proc.stdout, flags=re.M)[1:]
    assert hunks, proc.stdout
    return hunks


def test_every_hunk_of_the_twin_diff_names_its_ddp_step():
    for hunk in twin_diff_hunks():
        changed = "\n".join(line for line in hunk.splitlines() if line[:1] in "+-")
        assert STEP.search(changed), f"a hunk of the twin diff names no DDP step:\n{hunk}"


def test_every_import_the_twin_diff_adds_names_its_step():
    # an import is where a reader asks "what is this for?", and its hunk may name another step
    added = [
        line
        for hunk in twin_diff_hunks()
        for line in hunk.splitlines()
        if re.match(r"\+(import|from) ", line)
    ]
    assert added, "the conversion adds no import"
    untagged = [line[1:] for line in added if not STEP.search(line)]
    assert not untagged, f"imports the twin diff adds without naming their DDP step: {untagged}"


def test_every_line_of_code_the_twin_diff_adds_belongs_to_a_ddp_step():
    # a hunk that names a step can still hold a line that is not DDP: each line of code train_ddp.py
    # adds must be one of a step's lines, as the notebook's show_step(n) finds them (a line tagged
    # `DDP step n`, the changed lines under a comment that opens with the tag, a function whose
    # docstring does), or in a function the diff adds whole under a banner that names its step
    from walkthrough_helpers import step_lines

    baseline, ddp = (numbered_code_lines(ROOT / script) for script in SCRIPTS[:2])  # the DDP twins
    matcher = difflib.SequenceMatcher(None, [t for _, t in baseline], [t for _, t in ddp], autojunk=False)
    added = [line for op, _, _, j1, j2 in matcher.get_opcodes() if op != "equal" for line in ddp[j1:j2]]
    twin, code = ((ROOT / script).read_text().splitlines() for script in SCRIPTS[:2])
    belongs = {i + 1 for n in range(1, 11) for i in step_lines(n, code, twin)}
    in_baseline = {node.name for node in ast.parse("\n".join(twin)).body if isinstance(node, ast.FunctionDef)}
    for node in ast.parse("\n".join(code)).body:
        if isinstance(node, ast.FunctionDef) and node.name not in in_baseline:
            above = node.lineno - 1  # the line above the def, across blank lines: its banner, if any
            while above > 1 and not code[above - 1].strip():
                above -= 1
            if code[above - 1].startswith("#") and STEP.search(code[above - 1]):
                belongs |= set(range(node.lineno, node.end_lineno + 1))
    stray = [f"train_ddp.py:{n}: {line.strip()}" for n, line in added if n not in belongs]
    assert not stray, f"lines of code the twin diff adds that belong to no DDP step: {stray}"


def test_the_twin_diff_covers_every_step():
    named = {int(n) for hunk in twin_diff_hunks() for n in STEP.findall(hunk)}
    steps = set(range(1, 11))  # the guide's eight, and our two beyond it
    assert named == steps, f"steps missing from the diff: {steps - named}, unknown: {named - steps}"


# The FSDP twin: train_fsdp.py against train_ddp.py, its steps numbered as the DDP steps they replace
# (docs/fsdp.md): what is not an FSDP step, the plumbing included, is train_ddp.py's, byte for byte


def fsdp_diff_hunks():
    return twin_diff_hunks("train_ddp.py", "train_fsdp.py")


def test_every_hunk_of_the_fsdp_twin_diff_names_its_fsdp_step():
    for hunk in fsdp_diff_hunks():
        added = "\n".join(line for line in hunk.splitlines() if line[:1] == "+")
        assert FSDP_STEP.search(added), f"a hunk of the FSDP twin diff names no FSDP step:\n{hunk}"


def test_every_import_the_fsdp_twin_diff_adds_names_its_step():
    added = [
        line[1:]
        for hunk in fsdp_diff_hunks()
        for line in hunk.splitlines()
        if re.match(r"\+(import|from) ", line)
    ]
    assert added, "the FSDP twin adds no import"
    untagged = [line for line in added if not FSDP_STEP.search(line)]
    assert not untagged, f"imports the FSDP twin diff adds without naming their FSDP step: {untagged}"


def test_the_fsdp_twin_diff_changes_the_steps_docs_fsdp_md_lists():
    listed = {
        int(n) for n in re.findall(r"^- \*\*FSDP step (\d+):", (ROOT / "docs/fsdp.md").read_text(), re.M)
    }
    named = {int(n) for hunk in fsdp_diff_hunks() for n in FSDP_STEP.findall(hunk)}
    assert listed and named == listed, (
        f"steps the diff names: {sorted(named)}, the page lists: {sorted(listed)}"
    )


def test_ruff_lint_and_format_are_clean():
    for command in (["check", "."], ["format", "--check", "."]):
        proc = subprocess.run(
            [sys.executable, "-m", "ruff", *command], cwd=ROOT, capture_output=True, text=True
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_package_requirements_txt_pins_is_installed_at_its_version():
    # a missing or other version fails here, rather than a test skipping itself (an upgrade of
    # ruff or torch changes what the tests see: it must be made on purpose, in requirements.txt)
    # every line but a comment is a pin, with an inline comment or without: a line this test cannot
    # read would be a requirement it never checks
    text = (ROOT / "requirements.txt").read_text()
    lines = [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]
    unread = [line for line in lines if not re.fullmatch(r"[\w.-]+==[\w.+-]+", line)]
    assert not unread, f"requirements.txt: lines that are not name==version: {unread}"
    pins = [line.split("==") for line in lines]
    assert len(pins) >= 5, pins  # torch, numpy, pytest, ruff, the notebook's
    found = {}
    for name, _ in pins:
        try:
            found[name] = importlib.metadata.version(name).partition("+")[0]  # 2.13.0+cpu: a build of 2.13.0
        except importlib.metadata.PackageNotFoundError:
            found[name] = "missing"
    wrong = [f"{name}=={pinned}: {found[name]}" for name, pinned in pins if found[name] != pinned]
    assert not wrong, f"not as requirements.txt pins (pip install -r requirements.txt): {wrong}"


# What makes a line of a conversion a DDP line, in general: it takes part in the distributed job. It
# calls what torch's distributed modules define (dist.*, DDP, DistributedSampler, fully_shard) or reads
# what torchrun set (RANK, LOCAL_RANK, ...); or it reads a name such a line of the conversion made
# before it (the wrapped model, the sampler, this rank's device), or makes a new name one reads (the
# resumed path rank 0 broadcasts, a flag DDP is given); or it runs only because such a line decided
# it (the body of `if dist.get_rank() == 0:`, of `with model.no_sync():`, of a function only such
# lines call). A line the diff adds that does none of these (torch.backends.cudnn.benchmark = True
# put above the wrap) is not the conversion, however its hunk is tagged. What the job names outside the
# code counts as reading it: torchrun's variables; a sharded checkpoint's index, the file DCP writes
# last; and the meta device, on which FSDP2's tutorial builds a model that no rank may hold whole.
LAUNCH_VARIABLES = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
NAMED_BY_THE_JOB = LAUNCH_VARIABLES | {torch.distributed.checkpoint.filesystem._metadata_fn, "meta"}


def from_distributed(module, name=None):
    """Whether an import binds one of torch's distributed modules, or what one of them defines."""
    where = module
    if name is not None:
        import importlib

        found = getattr(importlib.import_module(module), name, None)
        where = getattr(found, "__name__", None) if isinstance(found, type(sys)) else None
        where = where or getattr(found, "__module__", None) or module
    return re.search(r"(^|\.)(distributed|parallel)(\.|$)", where) is not None


def bound(tree):
    """Every name a module binds anywhere (assigned, imported, defined, an argument), and each flag its
    parser defines, as ".name": what the old script already has."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
        names |= flags_defined(node)
    return names


def flags_defined(node):
    """parser.add_argument("--name", ...) defines args.name: ".name"."""
    if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument" and node.args:
        first = node.args[0]
        if isinstance(first, ast.Constant) and str(first.value).startswith("--"):
            return {"." + first.value[2:].replace("-", "_")}
    return set()


HEADERS = {  # the parts of a compound statement that are its own line(s), not its body's
    ast.If: ("test",),
    ast.While: ("test",),
    ast.For: ("target", "iter"),
    ast.With: ("items",),
    ast.FunctionDef: ("decorator_list", "args", "returns"),
    ast.ClassDef: ("decorator_list", "bases", "keywords"),
    ast.Try: (),
}


def own_nodes(statement):
    """The expressions a statement itself evaluates: all of a simple one; a compound one's header."""
    kind = type(statement)
    if kind not in HEADERS:
        return [statement]
    parts = [getattr(statement, field) for field in HEADERS[kind]]
    return [
        node for part in parts for node in (part if isinstance(part, list) else [part]) if node is not None
    ]


def facts(statement, distributed):
    """What a statement reads, the strings it holds, and what it defines: names it assigns, names it
    passes to a distributed call (dist.all_reduce(totals) makes totals the job's), the flags it adds."""
    reads, strings, defines = set(), set(), set()
    if isinstance(statement, (ast.FunctionDef, ast.ClassDef)):
        defines.add(statement.name)
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        defines |= {(a.asname or a.name).split(".")[0] for a in statement.names}
    for top in own_nodes(statement):
        for node in ast.walk(top):
            if isinstance(node, ast.Name):
                (reads if isinstance(node.ctx, ast.Load) else defines).add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                reads.add("." + node.attr)
            elif isinstance(node, ast.Constant) and isinstance(node.value, str):
                strings.add(node.value)
            elif isinstance(node, ast.Call):
                defines |= flags_defined(node)
                called = {n.id for n in ast.walk(node.func) if isinstance(n, ast.Name)}
                if called & distributed:
                    defines |= {arg.id for arg in node.args if isinstance(arg, ast.Name)}
    return reads, strings, defines


def non_ddp_statements(old_source, new_source):
    """The statements of new_source whose lines the diff from old_source adds, and that do not take part
    in the distributed job (see above): [(line, its text)], empty for a conversion that is all DDP."""
    old_tree, tree = ast.parse(old_source), ast.parse(new_source)
    lines = new_source.splitlines()
    distributed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            distributed |= {a.asname or a.name for a in node.names if from_distributed(a.name)}
        elif isinstance(node, ast.ImportFrom) and node.module:
            distributed |= {a.asname or a.name for a in node.names if from_distributed(node.module, a.name)}
    old_code, new_code = (numbered_code_lines_of(source) for source in (old_source, new_source))
    matcher = difflib.SequenceMatcher(
        None, [t for _, t in old_code], [t for _, t in new_code], autojunk=False
    )
    added = {n for op, _, _, j1, j2 in matcher.get_opcodes() if op != "equal" for n, _ in new_code[j1:j2]}

    statements, parent, function = [], {}, {}  # every statement; the compound one it sits in; its def

    def visit(node, outer, in_function):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.stmt):
                statements.append(child)
                parent[child], function[child] = outer, in_function
                visit(child, child, child if isinstance(child, ast.FunctionDef) else in_function)
            else:
                visit(child, outer, in_function)

    visit(tree, None, None)
    children = {s: [c for c in statements if parent[c] is s] for s in statements}

    def owner(n):  # the innermost statement a line is one of its own lines of
        holding = [s for s in statements if s.lineno <= n <= s.end_lineno]
        return max(holding, key=lambda s: s.lineno) if holding else None

    touched = {owner(n) for n in added} - {None}
    told = {s: facts(s, distributed) for s in statements}
    new_names = bound(tree) - bound(old_tree)
    calls = {}  # a function's name: the statements that call it
    for s in statements:
        for top in own_nodes(s):
            for node in ast.walk(top):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    calls.setdefault(node.func.id, []).append(s)

    def inside(s):
        while s is not None:
            yield s
            s = parent[s]

    ddp, header = set(), set()
    while True:
        before = (len(ddp), len(header))
        made = {}  # a name the conversion's own statements make: the first line that makes it
        for s in ddp:
            if any(t in touched for t in inside(s)):
                for name in told[s][2]:  # a def is bound before any line calls it
                    first = 0 if isinstance(s, ast.FunctionDef) else s.lineno
                    made[name] = min(made.get(name, first), first)
        read_by_ddp = {name for s in ddp for name in told[s][0]}
        for s in statements:
            reads, strings, defines = told[s]
            own = (
                reads & distributed
                or defines & distributed
                and isinstance(s, (ast.Import, ast.ImportFrom))
                or strings & NAMED_BY_THE_JOB
                or any(made.get(name, s.lineno) < s.lineno for name in reads)
            )
            if own and type(s) in HEADERS:
                header.add(s)
            governed = any(p in header for p in inside(parent[s]))
            f = function[s]
            called_by_ddp = f is not None and calls.get(f.name) and all(c in ddp for c in calls[f.name])
            feeds = defines & new_names & read_by_ddp
            holds = any(c in ddp for c in children[s])
            if own or governed or called_by_ddp or feeds or holds:
                ddp.add(s)
        if (len(ddp), len(header)) == before:
            break
    stray = sorted({owner(n) for n in added} - {None} - ddp, key=lambda s: s.lineno)
    return [(s.lineno, lines[s.lineno - 1].strip()) for s in stray]


def numbered_code_lines_of(source):
    return numbered_code_lines(SimpleNamespace(read_text=lambda: source))


def test_every_statement_either_twin_diff_adds_takes_part_in_the_distributed_job():
    for old, new in (SCRIPTS[:2], SCRIPTS[1:]):
        stray = non_ddp_statements((ROOT / old).read_text(), (ROOT / new).read_text())
        assert not stray, f"diff -u {old} {new} adds lines that are not the conversion: {stray}"


def planted(script, anchor, line):
    """A script's source with line put just above the line that starts with anchor, at its indent."""
    source = (ROOT / script).read_text()
    at = next(i for i, text in enumerate(source.splitlines(keepends=True)) if text.strip().startswith(anchor))
    lines = source.splitlines(keepends=True)
    indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
    return "".join(lines[:at] + [indent + line + "\n"] + lines[at:])


def test_a_line_that_is_not_ddp_in_a_tagged_hunk_is_found():
    # the check above, on lines that slip into a hunk a step names: one that tunes cuDNN just above the
    # DDP wrap, one that clears gradients in the load DDP step 6 tags; and in the FSDP twin, above fully_shard
    baseline, ddp, fsdp = ((ROOT / script).read_text() for script in SCRIPTS)
    for old, script, anchor, line in (
        (baseline, "train_ddp.py", "model = DDP(", "torch.backends.cudnn.benchmark = True"),
        (
            baseline,
            "train_ddp.py",
            "start_epoch = load_checkpoint(choice",
            "optimizer.zero_grad(set_to_none=True)",
        ),
        (ddp, "train_fsdp.py", "for block in model:", "torch.backends.cudnn.benchmark = True"),
    ):
        found = non_ddp_statements(old, planted(script, anchor, line))
        assert [text for _, text in found] == [line], (script, line, found)
