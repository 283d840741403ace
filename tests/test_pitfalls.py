"""Every pitfall in pitfalls/ runs alone, as its docstring says, and behaves as it documents."""

import ast
import os

import pytest
from helpers import ROOT, run

PITFALLS = sorted(p.name for p in (ROOT / "pitfalls").glob("*.py") if not p.name.startswith("_"))


def test_every_classic_mistake_has_its_pitfall():
    assert len(PITFALLS) >= 16, PITFALLS


@pytest.mark.parametrize("name", PITFALLS)
def test_pitfall_shows_its_mistake_and_fix(name):
    command = f"python pitfalls/{name}"
    assert command in ast.get_docstring(ast.parse((ROOT / "pitfalls" / name).read_text())), (
        f"{name}: its docstring must hold the command that runs it, {command!r}"
    )
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")  # the CPU, for every process, even on a GPU machine
    # exit 0: the mistake and the fix both behaved as the pitfall says
    lines = run(command, cwd=ROOT, env=env, timeout=90).stdout.splitlines()
    assert lines[-1] == "as documented", lines
    assert len(lines) <= 12, f"{name}: a few lines, not a wall of output:\n" + "\n".join(lines)
