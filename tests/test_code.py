"""How the code reads: the twin diff shows only named DDP steps, the FSDP twin's diff only named FSDP
steps, the lint is clean, and the tools are the versions requirements.txt pins."""

import ast
import difflib
import importlib.metadata
import re
import subprocess
import sys

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
