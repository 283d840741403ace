"""docs/troubleshooting.md shows the four hangs of pitfalls/ under PyTorch's own tools, as a kept run of
benchmarks/hang_tools.py printed them; the page says which tool answers which question, with the
commands that script runs; and a live run of one hang still says what the kept run said."""

import json
import sys

import pytest
from helpers import ROOT, cpu_env, run

sys.path.insert(0, str(ROOT / "benchmarks"))
import hang_tools  # noqa: E402  (benchmarks/ is not a package)

KEPT = "benchmarks/hang_tools.kept.json"
PAGE = (ROOT / "docs/troubleshooting.md").read_text()
# the questions a hang raises, and the tool the page says answers each
QUESTIONS = {
    "Which rank never came?": "monitored_barrier",
    "Which collective differed?": "TORCH_DISTRIBUTED_DEBUG=DETAIL",
    "Where was each rank?": "Flight Recorder",
}


def kept():
    return json.loads((ROOT / KEPT).read_text())


def test_each_hang_pitfall_is_shown_under_each_tool_from_the_kept_run():
    record = kept()
    assert record["backend"] == "gloo" and set(record["sections"]) == set(hang_tools.HANGS)
    for hang, (_, pitfall, _) in hang_tools.HANGS.items():
        assert (ROOT / "pitfalls" / pitfall).is_file(), pitfall
        assert set(record["gists"][hang]) == set(hang_tools.TOOLS), hang  # every tool said something
        # the page shows it (test_figures.py: as it was printed)
        assert f"<!-- kept: {KEPT}#{hang} -->" in PAGE, f"the page does not show {hang}"
    # the hang pitfalls' rows point to them: a hang mid-run, on either backend
    assert "[PyTorch's own tools](#a-hang-seen-with-pytorchs-own-tools)" in PAGE


def test_the_page_says_which_tool_answers_which_question_and_where_the_kept_run_ran():
    record = kept()
    section = PAGE.split("## A hang, seen with PyTorch's own tools")[1]
    for question, tool in QUESTIONS.items():
        row = next((line for line in section.splitlines() if line.startswith(f"| {question}")), "| | |")
        named = row.split("|")[2]  # the row's Tool
        assert tool in named, f"the page's row for {question!r} does not name {tool} as its tool: {row!r}"
    # the commands are the ones the kept run ran with: its environment variables, the analyser
    for said in ("TORCH_DISTRIBUTED_DEBUG=DETAIL", "TORCH_FR_BUFFER_SIZE=2000", "TORCH_FR_DUMP_TEMP_FILE"):
        assert said in section and said.split("=")[0] in (ROOT / "benchmarks/hang_tools.py").read_text(), said
    assert "python -m torch.distributed.flight_recorder.fr_trace" in section
    assert "dist.monitored_barrier(timeout=" in section and "wait_all_ranks=True" in section
    load = record["load_average"]
    where = (
        f"on {record['date'][:10]}, {record['machine']}, load average {load['start']:.1f} at the start and "
        f"{load['end']:.1f} at the end"
    )
    assert where in " ".join(section.split()), f"the page does not say where its kept run ran: {where}"


@pytest.mark.slow
def test_a_hang_under_each_tool_still_says_what_the_kept_run_said(tmp_path):
    # one hang, live: each tool's gist (who it names, which calls, where) as the kept run's
    hang = "collective_on_rank_zero"
    command = f"python benchmarks/hang_tools.py --hangs {hang} --keep {tmp_path / 'live.json'}"
    run(command, cwd=ROOT, env=cpu_env(), timeout=300)
    live = json.loads((tmp_path / "live.json").read_text())
    assert live["gists"][hang] == kept()["gists"][hang], (live["sections"][hang], kept()["sections"][hang])
