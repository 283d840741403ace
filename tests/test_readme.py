"""The pages stay true: the README's steps and test command match the code, CI and the checking
tool, the README stays a short path, every relative link leads to a file, and every test that
tests/README.md names exists."""

import ast
import json
import re
import shutil
import subprocess
from urllib.parse import unquote

from helpers import ROOT, notebook_exercise, readme_conversion, run

README = (ROOT / "README.md").read_text()
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "pitfalls" / "README.md",
    ROOT / "benchmarks" / "README.md",
    ROOT / "tests" / "README.md",
]
# the ten steps, one list: "- **DDP step N: <name>.** <its rule>", the rule down to the next item
STEP = re.compile(r"^- \*\*DDP step (\d+): ([^*]+?)\.\*\* (.+?)(?=\n- |\n\n)", flags=re.M | re.S)


def readme_steps():
    """{number: (name, rule)} of the README's list of steps."""
    return {int(n): (name, " ".join(rule.split())) for n, name, rule in STEP.findall(README)}


# [text](target) and ![alt](target), outside code; a target with a scheme (https:, mailto:) is not relative
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"^```.*?^```$|`[^`\n]*`", flags=re.S | re.M)


def test_readme_step_names_are_the_ones_in_train_ddp():
    steps = readme_steps()
    assert list(steps) == list(range(1, 11)), steps  # one list, in order
    code = (ROOT / "train_ddp.py").read_text()
    for number, (name, _) in steps.items():
        assert f"DDP step {number}: {name}" in code, f"train_ddp.py never says 'DDP step {number}: {name}'"


def ci_on(folder, readme):
    """Run .ci/run as CI does, in a folder of its own whose README.md is readme."""
    (folder / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci/run", folder / ".ci/run")
    (folder / "README.md").write_text(readme)
    return subprocess.run(["bash", ".ci/run"], cwd=folder, capture_output=True, text=True, timeout=60)


def test_ci_runs_the_readmes_test_command_and_fails_when_it_fails(tmp_path):
    def readme(command):
        return f"# A project\n\nRun the tests:\n\n<!-- test-command -->\n```bash\n{command}\n```\n"

    passing = ci_on(tmp_path / "passing", readme("echo ran > marker && echo $((6 * 7))"))
    assert passing.returncode == 0, passing.stderr
    assert (tmp_path / "passing/marker").read_text() == "ran\n"  # it ran the command, in the project
    assert passing.stdout == "+ echo ran > marker && echo $((6 * 7))\n42\n"  # what it ran, then its output
    failing = ci_on(tmp_path / "failing", readme("echo ran > marker && exit 3"))
    assert (tmp_path / "failing/marker").exists() and failing.returncode == 3, failing.stderr
    unmarked = ci_on(tmp_path / "unmarked", "# A project\n\n```bash\necho ran > marker\n```\n")
    assert unmarked.returncode == 1 and "no test command found" in unmarked.stderr
    assert not (tmp_path / "unmarked/marker").exists()
    # and on this README, the command CI runs is the one that sets up and runs this suite
    ci = subprocess.run(["bash", ".ci/run", "--print"], cwd=ROOT, capture_output=True, text=True)
    assert re.search(r"pip install -r requirements\.txt && \S*python -m pytest$", ci.stdout.strip()), (
        ci.stdout
    )


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


# the FSDP steps, one list: "- **FSDP step N: <name>.** <its rule>", each a DDP step's number
FSDP_STEP = re.compile(r"^- \*\*FSDP step (\d+): ([^*]+?)\.\*\* ", flags=re.M)


def test_the_fsdp_steps_are_named_in_train_fsdp_as_docs_fsdp_md_names_them():
    listed = {
        int(n): name.replace("`", "") for n, name in FSDP_STEP.findall((ROOT / "docs/fsdp.md").read_text())
    }
    assert set(listed) == {4, 6, 9, 10}, listed  # the four DDP steps FSDP2 changes, in their numbering
    assert set(listed) <= set(readme_steps()), "an FSDP step is numbered as no DDP step"
    code = (ROOT / "train_fsdp.py").read_text()
    for number, name in listed.items():
        assert f"FSDP step {number}: {name}" in code, f"train_fsdp.py never says 'FSDP step {number}: {name}'"


def test_check_ddp_names_the_steps_as_the_readme_does_and_its_pitfalls_exist():
    steps = {number: name for number, (name, _) in readme_steps().items()}
    assert assigned(ROOT / "check_ddp/steps.py", "STEPS") == steps
    pitfalls = assigned(ROOT / "check_ddp/steps.py", "PITFALLS").values()
    assert [path for path in pitfalls if not (ROOT / path).is_file()] == []


# The code the pages show ----------------------------------------------------------------------------------


def code_of(text):
    """The code in a markdown text: its code spans and fenced blocks, a diff's +/- markers removed."""
    fenced = re.findall(r"^```(\w*)\n(.*?)^```$", text, flags=re.S | re.M)
    blocks = [re.sub(r"^[-+ ]", "", body, flags=re.M) if kind == "diff" else body for kind, body in fenced]
    spans = re.findall(r"`([^`\n]+)`", re.sub(r"^```.*?^```$", "", text, flags=re.S | re.M))
    return blocks + spans


def pages_code():
    """The code of every page a learner reads: the README, docs/, and the notebook's prose."""
    texts = [page.read_text() for page in PAGES]
    notebook = json.loads((ROOT / "walkthrough.ipynb").read_text())
    texts += ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "markdown"]
    return [code for text in texts for code in code_of(text)]


def calls(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            yield getattr(node.func, "attr", getattr(node.func, "id", None)), node


def conversion_keywords():
    """The calls train_ddp.py makes and the baseline does not, with each keyword argument train_ddp.py
    gives them, as it spells it (a conditional's first branch too: `[device.index] if ... else None`)."""
    baseline = {name for name, _ in calls(ROOT / "single_gpu_baseline.py")}
    keywords = {}
    for name, node in calls(ROOT / "train_ddp.py"):
        if name not in baseline:
            for keyword in node.keywords:
                spellings = keywords.setdefault(name, {}).setdefault(keyword.arg, set())
                spellings.add(ast.unparse(keyword.value))
                if isinstance(keyword.value, ast.IfExp):
                    spellings.add(ast.unparse(keyword.value.body))
    return keywords


def shown_calls(code, names):
    """Each call of one of names in a piece of code: its text, and its syntax tree, or None where it
    does not parse (its parentheses unmatched, or not Python)."""
    for match in re.finditer(rf"\b({'|'.join(names)})\(", code):
        depth, text = 0, code[match.start() :]
        for end in range(match.end() - 1, len(code)):
            depth += {"(": 1, ")": -1}.get(code[end], 0)
            if depth == 0:
                text = code[match.start() : end + 1]
                break
        try:
            yield text, ast.parse(text, mode="eval").body
        except SyntaxError:
            yield text, None


def test_the_pages_pass_the_conversions_calls_what_train_ddp_passes_them():
    keywords = conversion_keywords()
    wrong, unreadable, shown = [], [], 0
    for code in pages_code():
        for text, call in shown_calls(code, keywords):
            if call is None:  # a call the pages show and this test cannot read is a claim left unchecked
                unreadable.append(text[:200])
                continue
            name = getattr(call.func, "attr", getattr(call.func, "id", None))
            for keyword in call.keywords:
                spelling = ast.unparse(keyword.value)
                shown += 1
                if spelling != "..." and spelling not in keywords[name].get(keyword.arg, ()):
                    wrong.append(
                        f"{ast.unparse(call)}: train_ddp.py passes {keyword.arg}= as "
                        f"{sorted(keywords[name].get(keyword.arg, ())) or 'nothing'}"
                    )
    assert not unreadable, (
        f"calls the pages show that do not parse as Python (write ... for a part left out): {unreadable}"
    )
    assert shown >= 3, "the pages show none of the conversion's calls with their arguments"  # DDP's, at least
    assert not wrong, wrong


def conversion_diff():
    """The README's conversion, both sides of its diff."""
    return re.search(r"^## Convert your own script\n.*?```diff\n(.*?)```", README, flags=re.S | re.M).group(1)


def test_the_step_rules_code_is_in_train_ddp_or_the_readmes_conversion():
    # as the code reads once the formatter's line breaks are undone: `DDP(\n        model, ...`
    code = re.sub(r"\s+", " ", re.sub(r"\(\s+", "(", (ROOT / "train_ddp.py").read_text()))
    shown = re.sub(r"\s+", " ", conversion_diff())
    spans = [span for _, rule in readme_steps().values() for span in re.findall(r"`([^`]+)`", rule)]
    assert len(spans) >= 10, spans
    missing = [
        span
        for span in spans
        if not any(re.search(".*?".join(map(re.escape, span.split("..."))), text) for text in (code, shown))
    ]
    assert not missing, f"the README's steps show code neither train_ddp.py nor its conversion has: {missing}"


def test_the_readmes_conversion_tags_each_line_with_the_step_the_list_gives_it():
    # each DDP step's comment in the conversion, in the order the code needs them; every step of
    # the guide's eight but the launch (a command) is there, and the exact evaluation (DDP step 10)
    tags = [int(n) for n in re.findall(r"# DDP step (\d+)\b", conversion_diff())]
    assert set(tags) == {*range(1, 8), 10}, tags
    assert set(tags) <= set(readme_steps())


# The words it uses ------------------------------------------------------------------------------------


def test_every_term_the_readme_defines_is_defined_before_its_first_use():
    # its terms: the bold words of its glossary's items (- **term**: ...), and a word in italics in
    # its prose, defined where it stands (its own *shard*)
    items = re.findall(r"^- \*\*[^*]+\*\*:.*?(?=\n(?!  )|\Z)", README, flags=re.M | re.S)
    assert len(items) >= 8, items
    defined = {term: f"**{term}**" for item in items for term in re.findall(r"\*\*([^*]+)\*\*", item)}
    defined |= {term: f"*{term}*" for term in re.findall(r"(?<![*\w])\*([a-z][a-z -]*)\*(?![*\w])", README)}
    # a picture's alt text says what the picture shows: where it stands, its words are used
    text = README
    early = []
    for term, definition in defined.items():
        first = re.search(rf"(?<![\w-]){re.escape(term)}(e?s)?(?![\w-])", text, flags=re.I)
        if first.start() < text.index(definition):
            line = text[: first.start()].count("\n") + 1
            early.append(f"{term!r}, used on line {line}, before it is defined")
    assert not early, early


def test_the_ten_steps_are_listed_before_the_readme_names_one():
    # "DDP step 3", "DDP steps 1 to 8" or the pattern "DDP step N": each reads as a step of the list,
    # which must have come first
    listed = README.index("- **DDP step 1: ")
    named = re.search(r"DDP steps? (\d+|N)\b", README)
    assert named.start() >= listed, f"{named.group()!r} on line {README[: named.start()].count(chr(10)) + 1}"


# The path a learner reads ---------------------------------------------------------------------------


def test_each_set_up_starts_from_nothing_with_the_torch_requirements_txt_pins():
    # two starts, with a GPU and CPU only, each one block: an environment made, activated, and
    # everything requirements.txt pins installed into it; the CPU build's torch is the version pinned
    section = re.search(r"^## Set up\n(.*?)^## ", README, flags=re.S | re.M).group(1)
    blocks = re.findall(r"^```bash\n(.*?)^```$", section, flags=re.S | re.M)
    assert len(blocks) == 2, blocks
    for block in blocks:
        steps = ["python3 -m venv .venv", "source .venv/bin/activate", "pip install -r requirements.txt"]
        at = [block.find(step) for step in steps]
        assert -1 not in at and at == sorted(at), f"a start that does not set up everything:\n{block}"
    pinned = re.search(r"^torch==(\S+)", (ROOT / "requirements.txt").read_text(), flags=re.M).group(1)
    cpu = re.search(r"pip install torch==(\S+) --index-url https://download.pytorch.org/whl/cpu", blocks[1])
    assert cpu and cpu.group(1) == pinned, blocks[1]
    assert blocks[1].index("--index-url") < blocks[1].index("-r requirements.txt")  # the CPU build first


def words_outside_code_blocks(text):
    """The words of a markdown text, its tables and code spans included, its fenced blocks not."""
    return len(re.sub(r"^```.*?^```$", "", text, flags=re.S | re.M).split())


def test_the_readme_is_a_short_path_with_the_rest_one_link_away():
    # what DDP does, set up, run it, convert, check it: the rest lives in docs/, pitfalls/, tests/
    assert words_outside_code_blocks(README) <= 1500, words_outside_code_blocks(README)
    headings = re.findall(r"^## (.+)$", README, flags=re.M)
    assert headings[:4] == ["What DDP does", "Set up", "Run it", "Convert your own script"], headings
    linked = {page for page in ("docs/troubleshooting.md", "docs/check-ddp.md", "pitfalls/README.md")}
    assert all(f"]({page})" in README for page in linked), "a page moved out of the README is not linked"


def test_the_pages_number_nothing_but_the_ddp_steps():
    # "DDP step 3" is a step of the conversion, and "FSDP step 4" the FSDP twin's change of it, in one
    # numbering (docs/fsdp.md); an optimizer step is never numbered, nor is anything else (a pitfall, a
    # batch the profiler records) called a step with a number
    texts = {page.relative_to(ROOT): page.read_text() for page in PAGES}
    notebook = json.loads((ROOT / "walkthrough.ipynb").read_text())
    texts["walkthrough.ipynb"] = "\n".join(
        "".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "markdown"
    )
    numbered = [
        f"{page}: {match.group()!r}"
        for page, text in texts.items()
        for match in re.finditer(
            r"(?<!DDP )\b[Ss]teps? \d+(?<!FSDP step \d)(?<!FSDP step \d\d)",
            re.sub(r"^```.*?^```$", "", text, flags=re.S | re.M),
        )
    ]
    assert not numbered, numbered


def test_the_readmes_conversion_runs_under_plain_torchrun_on_the_cpu_build(tmp_path):
    # the README's conversion of the ordinary script the notebook's Your turn gives, as a learner makes
    # it, in the device-agnostic form: no CUDA (as on torch's CPU build), so gloo on the CPU; rank 0
    # alone prints and saves (check_ddp.py checks its GPU path, stood in: tests/test_check_ddp.py)
    (tmp_path / "my_train.py").write_text(readme_conversion(notebook_exercise()))
    proc = run("torchrun --standalone --nproc_per_node=2 my_train.py", cwd=tmp_path, expect=None)
    # torch 2.13 may abort a gloo worker as Python shuts down, after the script's last line (pytorch/
    # pytorch#190489; docs/troubleshooting.md has its row): seen here under load, once in three runs
    ended = proc.returncode == 0 or "terminate called without an active exception" in proc.stderr
    assert ended, f"exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}"
    assert [line.split()[0] for line in proc.stdout.splitlines()] == ["0", "1"], proc.stdout
    assert (tmp_path / "ckpt.pt").is_file()
