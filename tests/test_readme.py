"""The pages stay true: the README's step names and test command match the code, CI and the checking
tool, every relative link leads to a file, and every test that tests/README.md names exists."""

import ast
import re
import subprocess
from urllib.parse import unquote

from helpers import ROOT

README = (ROOT / "README.md").read_text()
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "tests" / "README.md"]
# [text](target) and ![alt](target), outside code; a target with a scheme (https:, mailto:) is not relative
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"^```.*?^```$|`[^`\n]*`", flags=re.S | re.M)


def test_readme_step_names_are_the_ones_in_train_ddp():
    steps = dict(re.findall(r"^\| (\d+) \| ([^|]+?) \|", README, flags=re.M))
    assert sorted(steps, key=int) == [str(n) for n in range(1, 11)], steps
    code = (ROOT / "train_ddp.py").read_text()
    for number, name in steps.items():
        assert f"DDP step {number}: {name}" in code, f"train_ddp.py never says 'DDP step {number}: {name}'"


def test_ci_runs_the_readme_test_command():
    command = re.search(r"<!-- test-command -->\n```bash\n(.+)\n```", README).group(1)
    assert "pytest" in command
    ci = subprocess.run(["bash", ".ci/run", "--print"], cwd=ROOT, capture_output=True, text=True)
    assert ci.stdout.strip() == command


def anchors(page):
    """The #anchors GitHub makes of a page's headings."""
    headings = re.findall(r"^#+ (.+)$", CODE.sub("", page.read_text()), flags=re.M)
    return {re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-") for heading in headings}


def test_every_relative_link_leads_to_a_file_and_its_heading():
    broken = []
    for page in PAGES:
        for target in LINK.findall(CODE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = unquote(target).partition("#")
            path = (page.parent / file).resolve() if file else page
            if not path.exists() or (anchor and path.suffix == ".md" and anchor not in anchors(path)):
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_every_test_that_tests_readme_names_exists():
    named = re.findall(r"(test_\w+\.py)::(test_\w+)", (ROOT / "tests" / "README.md").read_text())
    assert len(named) > 20, named  # the table of proofs is there
    missing = [
        f"{file}::{name}"
        for file, name in named
        if not re.search(rf"^def {name}\(", (ROOT / "tests" / file).read_text(), flags=re.M)
    ]
    assert not missing, f"tests/README.md names tests that do not exist: {missing}"


def assigned(path, name):
    """The literal value a module assigns to name, read without running it."""
    tree = ast.parse(path.read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == name)
    return ast.literal_eval(node.value)


def test_check_ddp_names_the_steps_as_the_readme_does_and_its_pitfalls_exist():
    steps = {int(n): name for n, name in re.findall(r"^\| (\d+) \| ([^|]+?) \|", README, flags=re.M)}
    assert assigned(ROOT / "check_ddp.py", "STEPS") == steps
    pitfalls = assigned(ROOT / "check_ddp.py", "PITFALLS").values()
    assert [path for path in pitfalls if not (ROOT / path).is_file()] == []
