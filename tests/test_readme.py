"""The README stays true: its diff, its step names and its test command match the code."""

import re
import subprocess

from helpers import ROOT

README = (ROOT / "README.md").read_text()


DIFF_BLOCK = re.compile(r"^```diff\n(.*?)^```$", flags=re.S | re.M)


def twin_diff():
    return subprocess.run(
        ["diff", "-u", "--label", "single_gpu_baseline.py", "--label", "train_ddp.py"]
        + ["single_gpu_baseline.py", "train_ddp.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    ).stdout


def test_readme_shows_the_current_twin_diff():
    shown = DIFF_BLOCK.search(README)
    assert shown, "README.md has no ```diff block"
    assert shown.group(1) == twin_diff(), "README.md's diff is stale: run python tests/test_readme.py"


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


if __name__ == "__main__":  # python tests/test_readme.py: put the current diff into README.md
    (ROOT / "README.md").write_text(DIFF_BLOCK.sub(lambda _: f"```diff\n{twin_diff()}```", README, count=1))
